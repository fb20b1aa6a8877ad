//! The client under Slurm's `srun --mpi=pmix` (Slurm's own PMIx server, the
//! `mpi_pmix_v4` plugin), on the one-node cluster `ci/slurm.sh` starts: the
//! same child tests `tests_mpirun` runs under Open MPI's `mpirun`.
//!
//! Skipped, loudly, only where Slurm cannot run here (not root, packages
//! absent: `ci/slurm.sh` exits 77); under `CI=true` that fails instead.

use std::io::Write;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::tests_mpirun::{assert_aborted, assert_ranks_ok, describe, role_args, CHILD_ENV};

/// The cluster's `SLURM_CONF`, started once per test binary; `None` when
/// Slurm cannot run on this machine.
fn cluster() -> Option<&'static str> {
    static CONF: OnceLock<Result<String, String>> = OnceLock::new();
    let started = CONF.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../ci/slurm.sh");
        let out = Command::new("bash")
            .arg(script)
            .output()
            .unwrap_or_else(|e| panic!("running {script}: {e}"));
        match out.status.code() {
            Some(0) => Ok(String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("SLURM_CONF="))
                .unwrap_or_else(|| panic!("{script} printed no SLURM_CONF line\n{}", describe(&out)))
                .to_owned()),
            Some(77) => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
            _ => panic!("{script} failed\n{}", describe(&out)),
        }
    });
    match started {
        Ok(conf) => Some(conf),
        Err(why)
            if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
                && !std::env::var("FABRIC_MSG_SLURM").is_ok_and(|v| v == "off") =>
        {
            panic!("Slurm is required under CI=true, but ci/slurm.sh skipped:\n{why}")
        }
        Err(why) => {
            // Straight to fd 2, past libtest's capture of eprintln!, so the
            // skip shows even when the test passes.
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: the PMIx client under srun is NOT tested here ***\n{why}"
            );
            None
        }
    }
}

/// Runs the child test `child` as `np` tasks of `srun --mpi=pmix`, all of
/// it bounded by `limit`, with no Slurm or PMIx variables of our own.
fn srun(conf: &str, np: u32, child: &str, limit: Duration) -> Output {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new("timeout");
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("SLURM_") || name.starts_with("PMIX_") || name.starts_with("PMI_") {
            cmd.env_remove(&*name);
        }
    }
    let out = cmd
        .args(["--kill-after=10", &limit.as_secs().to_string()])
        .args(["srun", "--mpi=pmix", "-n", &np.to_string(), "--time=5"])
        .arg(&exe)
        .args(role_args(child))
        .env("SLURM_CONF", conf)
        .env(CHILD_ENV, child)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `timeout` (coreutils): {e}"));
    if out.status.code() == Some(124) {
        panic!("srun ran past {limit:?} and was stopped\n{}", describe(&out));
    }
    out
}

/// Rank, size, namespace, local rank and peers, host name, and a
/// put/commit/fence/get exchange, from Slurm's PMIx server.
#[test]
fn srun_three_ranks_exchange() {
    let Some(conf) = cluster() else { return };
    let out = srun(conf, 3, "child_exchange", Duration::from_secs(90));
    assert_ranks_ok(&out, "child_exchange", 3);
}

/// `PMIx_Abort` from one rank ends every task of the step, and srun exits
/// with the abort's status. The namespace is Slurm's (`slurm.pmix.<job>.<step>`).
#[test]
fn srun_abort_ends_the_job() {
    let Some(conf) = cluster() else { return };
    let start = Instant::now();
    let out = srun(conf, 3, "child_abort", Duration::from_secs(60));
    assert_aborted(&out, start.elapsed(), "srun");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("of PMIx namespace slurm.pmix."),
        "{}",
        describe(&out)
    );
}
