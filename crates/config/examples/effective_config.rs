//! Prints the effective configuration for a command line, as `--write-config-to` would write it:
//! `cargo run -p kproxy-config --example effective_config -- --config FILE -v=2 ...`

use clap::Parser;

/// Prints the KubeProxyConfiguration kproxy would run with.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    flags: kproxy_config::Flags,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let yaml = kproxy_config::resolve(&cli.flags).and_then(|config| {
        for warning in &config.warnings {
            eprintln!("warning: {warning}");
        }
        config.to_kube_proxy_configuration_yaml()
    });
    match yaml {
        Ok(yaml) => {
            print!("{yaml}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
