//! Commands served by another binary of the repository, in the way `git`
//! and `cargo` run their external subcommands: `protoplane bench …` runs
//! `protoplane-bench …` (the benchmark harnesses, `crates/bench`) and
//! `protoplane inc …` runs `protoplane-inc …` (the runner of the in-network
//! computation examples, `examples/inc`). The command line itself so
//! depends on no harness, peer or example.
//!
//! The binary is looked up beside this one (both are built into the same
//! target directory). It runs with `PROTOPLANE_BIN` set to this binary, so
//! the processes it starts (servers, engines, switches, load) are this
//! `protoplane`. When it is missing and this binary was built from a
//! checkout that is still there, it is built first, with the same profile
//! into the same target directory, saying so on stderr.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Another binary of the repository.
#[derive(Debug)]
pub(crate) struct Tool {
    /// Its file name.
    bin: &'static str,
    /// The package that builds it.
    package: &'static str,
}

/// `protoplane bench …`.
pub(crate) const BENCH: Tool = Tool { bin: "protoplane-bench", package: "protoplane-bench" };
/// `protoplane inc …`.
pub(crate) const INC: Tool = Tool { bin: "protoplane-inc", package: "protoplane-inc-examples" };

/// Everything after the command's name, passed on untouched (`--help`
/// included).
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub(crate) args: Vec<OsString>,
}

/// Runs `tool` with `args` in place of this process; returns only if it
/// could not be started.
pub(crate) fn run(tool: Tool, args: &[OsString]) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let exe = me.with_file_name(tool.bin);
    if !exe.exists() {
        build(&tool, &me)?;
    }
    let err = Command::new(&exe).args(args).env("PROTOPLANE_BIN", &me).exec();
    Err(format!("{}: {err}", exe.display()))
}

/// Builds `tool` beside `me`, from the checkout `me` was built from.
fn build(tool: &Tool, me: &Path) -> Result<(), String> {
    let missing = || {
        format!(
            "{} is not built: cargo build --release -p {} (beside {})",
            tool.bin,
            tool.package,
            me.display()
        )
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let (Some(dir), true) = (me.parent(), manifest.is_file()) else {
        return Err(missing());
    };
    let (Some(profile), Some(target)) =
        (dir.file_name().and_then(|p| p.to_str()), dir.parent().map(PathBuf::from))
    else {
        return Err(missing());
    };
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.arg("build").arg("--manifest-path").arg(&manifest).arg("--target-dir").arg(&target);
    cargo.args(["--quiet", "-p", tool.package, "--bin", tool.bin]);
    match profile {
        "debug" => {}
        "release" => {
            cargo.arg("--release");
        }
        other => {
            cargo.args(["--profile", other]);
        }
    }
    eprintln!("protoplane: building {} first ({cargo:?})", tool.bin);
    match cargo.status() {
        Ok(s) if s.success() && dir.join(tool.bin).exists() => Ok(()),
        Ok(s) => Err(format!("{} ({s})", missing())),
        Err(e) => Err(format!("{} (cargo: {e})", missing())),
    }
}
