//! `mock-ec2`: serve a scenario file as EC2's DescribeInstanceTopology on loopback (with the
//! stand-in STS and EKS Auth beside it); `mock-ec2 pod-identity-agent` is the stand-in EKS Pod
//! Identity Agent, `mock-ec2 pod-identity-agent-init` its init step.

use std::{net::IpAddr, net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand};
use mock_ec2::{AuthConfig, MockEc2, Scenario, agent};

#[derive(Parser)]
#[command(
    version,
    about = "A mock of EC2 DescribeInstanceTopology with fault injection",
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "MOCK_EC2_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Scenario file (JSON: {"instances": [...]}).
    #[arg(long, env = "MOCK_EC2_SCENARIO")]
    scenario: Option<PathBuf>,
    /// What is accepted at start (JSON, as `PUT /_admin/auth`): signature verification, keys,
    /// roles, Pod Identity associations, session length.
    #[arg(long, env = "MOCK_EC2_AUTH")]
    auth: Option<PathBuf>,
    /// Write the base URL here once listening (for scripts that start it on a free port).
    #[arg(long, env = "MOCK_EC2_URL_FILE")]
    url_file: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// The stand-in EKS Pod Identity Agent (serve credentials on the node's link-local address).
    PodIdentityAgent(agent::AgentArgs),
    /// The agent's init step: put its addresses on the node's loopback interface (NET_ADMIN).
    PodIdentityAgentInit {
        #[arg(long = "address", required = true, num_args = 1..)]
        addresses: Vec<IpAddr>,
    },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One rustls provider (ring) for the client that reads the cluster's signing keys.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    match args.command {
        Some(Command::PodIdentityAgent(a)) => return agent::run(a).await,
        Some(Command::PodIdentityAgentInit { addresses }) => return agent::init(&addresses).await,
        None => {}
    }
    let scenario = match &args.scenario {
        Some(path) => Scenario::from_json(&std::fs::read_to_string(path)?)
            .map_err(|e| format!("{}: {e}", path.display()))?,
        None => Scenario::default(),
    };
    let count = scenario.instances.len();
    let mock = MockEc2::new(scenario);
    if let Some(path) = &args.auth {
        let config: AuthConfig = serde_json::from_str(&std::fs::read_to_string(path)?)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        mock.set_auth(config);
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let url = format!("http://{}", listener.local_addr()?);
    if let Some(path) = &args.url_file {
        // Write then rename, so a reader never sees a partial URL.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &url)?;
        std::fs::rename(&tmp, path)?;
    }
    println!("mock-ec2 listening on {url} with {count} instances");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    axum::serve(listener, mock_ec2::router(mock))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
