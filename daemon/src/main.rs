use clap::Parser;
use ringside_daemon::config::{read_token_file, Cli, Command, Config};

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RINGSIDE_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(Command::Snapshot { url, token_file, ca_file }) = &cli.command {
        return snapshot(url, token_file.as_deref(), ca_file.as_deref());
    }
    let config = match Config::load(&cli, std::env::var("RINGSIDE_TOKEN").ok()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ringsided: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ringsided: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ringside_daemon::run(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringsided: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `ringsided snapshot --url URL [--token-file FILE] > snapshot.json`
fn snapshot(
    url: &str,
    token_file: Option<&std::path::Path>,
    ca_file: Option<&std::path::Path>,
) -> std::process::ExitCode {
    let token = match token_file {
        Some(path) => match read_token_file(path) {
            Ok(tokens) => tokens.into_iter().next().map(|t| t.secret),
            Err(e) => {
                eprintln!("ringsided snapshot: {e}");
                return std::process::ExitCode::from(2);
            }
        },
        None => std::env::var("RINGSIDE_TOKEN").ok().filter(|t| !t.is_empty()),
    };
    let Some(token) = token else {
        eprintln!("ringsided snapshot: no token: pass --token-file FILE or set RINGSIDE_TOKEN");
        return std::process::ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ringsided snapshot: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ringside_daemon::fetch_snapshot(url, &token, ca_file)) {
        Ok(body) => {
            println!("{body}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ringsided snapshot: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
