//! `protoplane-inc`: the runner of the in-network computation examples.
//! `protoplane inc …` hands its arguments to this binary (the command
//! itself depends on no example); see [`protoplane_inc_examples::runner`].
//!
//! Exit status: 0 every result exact, 1 a result not exact, 2 usage errors
//! and processes that could not run.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use protoplane_inc_examples::runner::{self, IncCommand};

#[derive(Parser, Debug)]
#[command(
    name = "protoplane inc",
    bin_name = "protoplane inc",
    about = "protoplane's in-network computation examples"
)]
struct Cli {
    #[command(subcommand)]
    command: IncCommand,
}

fn main() -> ExitCode {
    let failed = |m: String| {
        eprintln!("protoplane: {m}");
        ExitCode::from(2)
    };
    let cli = Cli::parse();
    // The server agent's and the runtime's warnings, on stderr (RUST_LOG).
    if let Err(m) = protoplane_telemetry::init_logs(Default::default()) {
        return failed(m);
    }
    match cli.command {
        IncCommand::Run(args) => {
            let report = match runner::inc_run(&args) {
                Ok(r) => r,
                Err(e) => return failed(e),
            };
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(runner::print_run(&args, &report).as_bytes()) {
                return failed(format!("stdout: {e}"));
            }
            let _ = out.flush();
            if report.exact {
                ExitCode::SUCCESS
            } else {
                eprintln!("protoplane: the results are not exact");
                ExitCode::from(1)
            }
        }
        IncCommand::Server(args) => {
            runner::run_role(&args, true).map_or_else(failed, |()| ExitCode::SUCCESS)
        }
        IncCommand::Client(args) => {
            runner::run_role(&args, false).map_or_else(failed, |()| ExitCode::SUCCESS)
        }
        IncCommand::Gen(args) => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            match runner::inc_gen(&args, &mut out)
                .and_then(|()| out.flush().map_err(|e| format!("stdout: {e}")))
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failed(e),
            }
        }
    }
}
