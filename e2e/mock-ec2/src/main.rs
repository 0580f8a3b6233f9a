//! `mock-ec2`: serve a scenario file as EC2's DescribeInstanceTopology on loopback.

use std::{net::SocketAddr, path::PathBuf};

use clap::Parser;
use mock_ec2::{MockEc2, Scenario};

#[derive(Parser)]
#[command(
    version,
    about = "A mock of EC2 DescribeInstanceTopology with fault injection"
)]
struct Args {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "MOCK_EC2_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Scenario file (JSON: {"instances": [...]}).
    #[arg(long, env = "MOCK_EC2_SCENARIO")]
    scenario: Option<PathBuf>,
    /// Write the base URL here once listening (for scripts that start it on a free port).
    #[arg(long, env = "MOCK_EC2_URL_FILE")]
    url_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let scenario = match &args.scenario {
        Some(path) => Scenario::from_json(&std::fs::read_to_string(path)?)
            .map_err(|e| format!("{}: {e}", path.display()))?,
        None => Scenario::default(),
    };
    let count = scenario.instances.len();
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
    axum::serve(listener, mock_ec2::router(MockEc2::new(scenario)))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
