//! A rank whose pid once belonged to a SIGKILLed rank: libfabric 1.17's shm
//! left that rank's region in /dev/shm under the pid, and shm would refuse
//! to open an endpoint of the same name (FI_EBUSY). The rank must start on
//! shm anyway.

use std::process::{Command, Stdio};

const SPMD: &str = env!("CARGO_BIN_EXE_spmd");

#[test]
fn stale_shm_regions_of_a_dead_process_with_our_pid_do_not_stop_a_rank() {
    // The shell plants regions named for its own pid, as a SIGKILLed rank
    // leaves them (its endpoint's, `<pid>:0:1`; the probe's and the next
    // ones too, for good measure), then becomes spmd (exec keeps the pid):
    // a world of one, on shm.
    let script = format!(
        "for b in 0 1 2; do head -c 4096 /dev/zero > /dev/shm/$$:0:$b; done; \
         echo $$; exec {SPMD} -n 50"
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .env_remove("FI_PROVIDER")
        .env_remove("FABRIC_MSG_RANK")
        .env_remove("FABRIC_MSG_SIZE")
        .env_remove("FABRIC_MSG_ROOT")
        .env_remove("PMIX_RANK")
        .env_remove("PMIX_NAMESPACE")
        .stdin(Stdio::null())
        .output()
        .expect("sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pid = stdout.lines().next().unwrap_or_default().trim().to_string();
    for b in 0..3 {
        std::fs::remove_file(format!("/dev/shm/{pid}:0:{b}")).ok();
    }
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ring of 1 rank(s) over shm (single)"), "{stdout}");
}
