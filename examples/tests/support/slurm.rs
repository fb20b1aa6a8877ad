//! A one-node Slurm cluster for the tests, started by `ci/slurm.sh` once
//! per test binary, and `srun --mpi=pmix` launches on it.

use super::clean;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// `ci/slurm.sh`'s status for "cannot run here" (not root, no packages).
const SKIPPED: i32 = 77;

/// The cluster's `SLURM_CONF`, or `None` when Slurm cannot run on this
/// machine (said loudly on stderr). Under `CI=true` that is a failure: CI
/// must not pass without having run Slurm. Any other problem starting the
/// cluster fails the test, with the daemons' logs.
pub fn cluster() -> Option<&'static str> {
    static CONF: OnceLock<Result<String, String>> = OnceLock::new();
    let started = CONF.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../ci/slurm.sh");
        let out = Command::new("bash")
            .arg(script)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {script}: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        match out.status.code() {
            Some(0) => stdout
                .lines()
                .find_map(|l| l.strip_prefix("SLURM_CONF="))
                .map(str::to_owned)
                .ok_or(format!("{script} printed no SLURM_CONF line: {stdout}\n{stderr}")),
            Some(SKIPPED) => Err(stderr),
            _ => panic!("{script} failed ({}):\n{stderr}", out.status),
        }
    });
    match started {
        Ok(conf) => Some(conf),
        Err(why) if in_ci() && !opted_out() => {
            panic!("Slurm is required under CI=true, but ci/slurm.sh skipped:\n{why}")
        }
        Err(why) => {
            // Straight to fd 2, past libtest's capture of eprintln!, so the
            // skip shows even when the test passes.
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: the World under srun --mpi=pmix is NOT tested here ***\n{why}"
            );
            None
        }
    }
}

/// Slurm turned off on purpose (`FABRIC_MSG_SLURM=off`, as
/// ci/libfabric2.sh's root does): a loud skip, even under CI.
fn opted_out() -> bool {
    std::env::var("FABRIC_MSG_SLURM").is_ok_and(|v| v == "off")
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// `srun --mpi=pmix -n <n>` of `program` on the cluster at `conf`, with
/// `FABRIC_MSG_SHM` and the extra `env`, and no Slurm or PMIx variables from
/// the test's own environment (a test run inside a Slurm job would
/// otherwise launch a step of that job). `srun_args` go before the program.
pub fn srun(
    conf: &str,
    program: &str,
    n: u32,
    shm: bool,
    srun_args: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
) -> Child {
    let mut cmd = Command::new("srun");
    clean(&mut cmd);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("SLURM_") || k.starts_with("PMIX_") || k.starts_with("PMI_") {
            cmd.env_remove(&*k);
        }
    }
    cmd.env("SLURM_CONF", conf)
        .env("FABRIC_MSG_SHM", if shm { super::shm_on() } else { "0" })
        .envs(env.iter().copied())
        .args([
            "--mpi=pmix",
            "-n",
            &n.to_string(),
            "--job-name=fabric-msg-test",
            "--time=5",
        ])
        .args(srun_args)
        .arg(program)
        .args(args);
    cmd.spawn().expect("srun (ci/setup.sh installs slurm-client)")
}
