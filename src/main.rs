//! Entry point: parse flags, set up logging and TLS, run the chosen command.

use std::{io::IsTerminal, process::ExitCode};

use ec2_topology_labeler::{
    cmd::{Cli, Command},
    flags::LogFormat,
};
use tracing_subscriber::{EnvFilter, fmt};

/// mimalloc instead of the C library's allocator, only when built with `--features mimalloc`:
/// the image keeps musl's, which held peak RSS to about half (docs/benchmarks-allocator.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        // One object per line: the event's fields at the top, the reconcile's node and instance
        // under "span" (the list of enclosing spans would only repeat them).
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
        LogFormat::Text => builder.init(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_checked();
    init_logging(cli.globals.log_format);
    // One rustls crypto provider for the whole process (kube and the AWS SDK both use ring);
    // installed before any client is built. It can only fail if one is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The command runs as a task on the runtime's workers, not on this thread: the controller's
    // Node watch is polled by it, and a task that only this thread polls is woken across
    // threads at every watch event (a futex wake and two context switches each: half the CPU a
    // heartbeat cost, measured). On a worker, the connection's task wakes it on its own thread.
    let command = tokio::spawn(async move {
        match cli.command {
            Command::Run(args) => ec2_topology_labeler::cmd::run::run(args).await,
            Command::Plan(args) => ec2_topology_labeler::cmd::plan::run(args).await,
            Command::Tree(args) => ec2_topology_labeler::cmd::tree::run(args).await,
            Command::Fit(args) => ec2_topology_labeler::cmd::fit::run(args).await,
            Command::Explain(args) => ec2_topology_labeler::cmd::explain::run(args).await,
            Command::Uninstall(args) => ec2_topology_labeler::cmd::uninstall::run(args).await,
            Command::Retire(args) => ec2_topology_labeler::cmd::retire::run(args).await,
        }
    });
    match command.await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            tracing::error!(error = %e, category = e.category(), "exiting");
            ExitCode::FAILURE
        }
        // A panic is printed by the panic hook where it happened.
        Err(e) => {
            tracing::error!(error = %e, "exiting: the command panicked");
            ExitCode::FAILURE
        }
    }
}
