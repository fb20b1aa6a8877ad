//! The World as users start it: `spmd` launched by the rendezvous variables,
//! by `mpirun` (PMIx), and alone; every byte of the ring checked by the
//! program itself; ranks that exit early or are killed; ranks that disagree
//! on the fabric; a finished rank serving the others' one-sided reads. Every process has a deadline, so a hang fails the test.

use crate::support;

use std::process::{Child, Command};
use std::time::{Duration, Instant};
use support::{
    assert_verified_ring, best_tcp, children_of, clean, environ_has, free_port, process_state, sigkill,
    wait_all, Exit, Watch,
};

const SPMD: &str = env!("CARGO_BIN_EXE_spmd");
/// Longest any one launch may take.
const DEADLINE: Duration = Duration::from_secs(90);
/// How soon the survivors of a lost rank must have said so and exited:
/// noticing takes milliseconds, but a send already retrying on a full
/// queue to the dead rank gives up only after `LoopConfig::post_timeout`
/// (5 s); the rest is start-up on a loaded 2-core machine.
const LOSS_BOUND: Duration = Duration::from_secs(12);

/// Start `n` ranks through the rendezvous; `env(rank)` adds variables.
fn rendezvous(n: u32, args: &[&str], env: impl Fn(u32) -> Vec<(&'static str, String)>) -> Vec<Child> {
    let root = format!("127.0.0.1:{}", free_port());
    (0..n)
        .map(|r| {
            let mut cmd = Command::new(SPMD);
            clean(&mut cmd)
                .args(args)
                .env("FABRIC_MSG_RANK", r.to_string())
                .env("FABRIC_MSG_SIZE", n.to_string())
                .env("FABRIC_MSG_ROOT", &root);
            for (k, v) in env(r) {
                cmd.env(k, v);
            }
            cmd.spawn().expect("starting spmd")
        })
        .collect()
}

fn ring(n: u32, messages: &str, shm: bool) -> Vec<Exit> {
    ring_with(n, &["-n", messages, "-S", "4096"], shm)
}

fn ring_with(n: u32, args: &[&str], shm: bool) -> Vec<Exit> {
    let started = Instant::now();
    let shm = if shm { support::shm_on() } else { "0" };
    wait_all(
        rendezvous(n, args, |_| vec![("FABRIC_MSG_SHM", shm.to_string())]),
        started,
        DEADLINE,
    )
}

#[test]
fn alone_is_a_world_of_one() {
    let started = Instant::now();
    let mut cmd = Command::new(SPMD);
    let child = clean(&mut cmd).args(["-n", "200"]).spawn().expect("spmd");
    let exits = wait_all(vec![child], started, DEADLINE);
    assert_verified_ring(&exits, 1, "shm", "single");
}

#[test]
fn rendezvous_rings_on_tcp() {
    for n in [2, 3, 4] {
        assert_verified_ring(&ring(n, "1000", false), n, best_tcp(), "rendezvous");
    }
}

#[test]
fn rendezvous_rings_on_shm() {
    for n in [2, 3, 4] {
        assert_verified_ring(&ring(n, "1000", true), n, "shm", "rendezvous");
    }
}

/// 5000 messages per rank, a window of 64 sends in flight and no
/// application-level credits: the sender may run far ahead of the
/// receiver's posted receives.
#[test]
fn rendezvous_ring_of_5000_without_flow_control() {
    assert_verified_ring(&ring(4, "5000", true), 4, "shm", "rendezvous");
    assert_verified_ring(&ring(4, "5000", false), 4, best_tcp(), "rendezvous");
}

/// Issue 11's flood: every rank posts all 5000 sends of 4 KiB at once
/// while its neighbour keeps only 64 receives posted, so nearly every
/// message arrives unexpected. shm (1.17) refuses a sender once the
/// receiver holds rx_size of them; before the send backlog each rank then
/// spun inside `send` waiting for a neighbour that was itself spinning in
/// `send`, and the ring wedged with QueueFull (3 of 3 runs).
#[test]
fn a_ring_flooding_unexpected_messages_completes_on_every_provider() {
    let flood = ["-n", "5000", "-S", "4096", "-w", "5000", "-r", "64"];
    assert_verified_ring(&ring_with(4, &flood, true), 4, "shm", "rendezvous");
    assert_verified_ring(&ring_with(4, &flood, false), 4, best_tcp(), "rendezvous");
}

#[test]
fn eight_ranks_on_two_cores() {
    assert_verified_ring(&ring(8, "500", true), 8, "shm", "rendezvous");
    assert_verified_ring(&ring(8, "500", false), 8, best_tcp(), "rendezvous");
}

/// A rank that has finished keeps serving the others until all have:
/// rank 0 of `finish_serves` finishes at once, and ranks 1 and 2 then read
/// its 1 MiB region one-sided, every byte checked. Over TCP (manual
/// progress) the reads complete only because `World::finish` keeps reading
/// the CQ while it waits: before it did, every rank failed ("not every rank
/// finished within 10s"). shm reads by CMA without the target's help; it is
/// covered too.
#[test]
fn a_finished_rank_serves_one_sided_reads_until_all_have_finished() {
    const FINISH_SERVES: &str = env!("CARGO_BIN_EXE_finish_serves");
    for (shm, provider) in [(false, best_tcp()), (true, "shm")] {
        let started = Instant::now();
        let exits = wait_all(support::rendezvous(FINISH_SERVES, 3, shm, &[]), started, DEADLINE);
        for (r, e) in exits.iter().enumerate() {
            let want = if r == 0 {
                "rank 0/3: finished at once; 2 rank(s) read its 1048576 bytes meanwhile".to_string()
            } else {
                format!("rank {r}/3: read rank 0's 1048576 bytes after rank 0 finished")
            };
            assert!(
                e.status.success() && e.stdout.contains(&want) && e.stdout.contains(&format!("({provider})")),
                "rank {r} on {provider}: {:?}\n{}{}",
                e.status,
                e.stdout,
                e.stderr
            );
        }
    }
}

fn assert_others_name(exits: &[Exit], lost: usize, started_loss: Duration) {
    for (r, e) in exits.iter().enumerate() {
        if r == lost {
            continue;
        }
        assert!(!e.status.success(), "rank {r} should have failed: {e:?}");
        assert!(
            e.stderr.contains(&format!("rank {lost} is lost")),
            "rank {r} does not name rank {lost}: {}",
            e.stderr
        );
        let after = e.at.saturating_sub(started_loss);
        assert!(after < LOSS_BOUND, "rank {r} took {after:?} to give up");
    }
}

#[test]
fn a_rank_that_exits_early_is_named_by_every_other() {
    let started = Instant::now();
    let exits = wait_all(
        rendezvous(4, &["-n", "100000000", "--exit-early", "2"], |_| vec![]),
        started,
        DEADLINE,
    );
    assert_eq!(exits[2].status.code(), Some(3), "{:?}", exits[2]);
    assert_others_name(&exits, 2, exits[2].at);
}

/// `FABRIC_MSG_LOG=json`: what the library logs is one JSON object per
/// line, each carrying the rank it came from, and a loss names the peer,
/// so every rank's stderr can be merged and filtered by field.
#[test]
fn a_loss_is_logged_as_json_with_rank_and_peer() {
    let started = Instant::now();
    let exits = wait_all(
        rendezvous(3, &["-n", "100000000", "--exit-early", "2"], |_| {
            vec![("FABRIC_MSG_LOG", "json".to_string())]
        }),
        started,
        DEADLINE,
    );
    for (r, e) in exits.iter().enumerate().take(2) {
        let records: Vec<serde_json::Value> = e
            .stderr
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|err| panic!("rank {r}: not JSON ({err}): {l}")))
            .collect();
        assert!(
            records
                .iter()
                .all(|v| v["rank"] == r && v["pid"].is_u64() && v["ts"].is_f64()),
            "rank {r}: every record says who and when: {records:?}"
        );
        let loss = records
            .iter()
            .find(|v| v["op"] == "liveness" && v["level"] == "WARN")
            .unwrap_or_else(|| panic!("rank {r} logged no loss as JSON: {}", e.stderr));
        assert!(loss["peer"].is_u64(), "rank {r}: {loss}");
        if r == 0 {
            // The rendezvous' root hears of rank 2 first, from its own connection.
            assert_eq!(loss["peer"], 2, "{loss}");
        }
    }
}

#[test]
fn a_rank_killed_mid_ring_is_named_by_every_other() {
    for shm in [support::shm_on(), "0"] {
        let started = Instant::now();
        let mut children = rendezvous(4, &["-n", "100000000", "--announce"], |_| {
            vec![("FABRIC_MSG_SHM", shm.to_string())]
        });
        // Once every rank runs the ring (start-up takes seconds on a loaded
        // machine), let it run, then kill rank 1 as a crash would.
        let watches: Vec<Watch> = children.iter_mut().map(Watch::stdout).collect();
        for (r, w) in watches.iter().enumerate() {
            assert!(
                w.wait_for("ring running", 1, Duration::from_secs(60)),
                "rank {r} did not start the ring: {}",
                w.text()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            children[1].try_wait().expect("rank 1").is_none(),
            "rank 1 ended early"
        );
        children[1].kill().expect("SIGKILL rank 1");
        let killed = started.elapsed();
        let exits = wait_all(children, started, DEADLINE);
        assert_others_name(&exits, 1, killed);
    }
}

/// Rank 1 is restricted to TCP: the world agrees on what every rank has,
/// and says why on rank 0.
#[test]
fn ranks_that_prefer_different_fabrics_agree_on_one() {
    let started = Instant::now();
    let children = rendezvous(3, &["-n", "200"], |r| {
        if r == 1 {
            vec![("FI_PROVIDER", "tcp".to_string())]
        } else {
            vec![]
        }
    });
    let exits = wait_all(children, started, DEADLINE);
    assert_verified_ring(&exits, 3, best_tcp(), "rendezvous");
    let why = &exits[0].stderr;
    let agreed = format!(
        "rank 1 can reach nothing better than tcp via {} (rdm): using it for all 3 ranks",
        best_tcp()
    );
    assert!(
        why.contains(&agreed) && why.contains("ranks 0, 2 preferred shm via shm (rdm)"),
        "{why}"
    );
}

/// Rank 0 can only use shm, rank 1 only tcp: no fabric is common. Both
/// fail with the same reason; neither hangs.
#[test]
fn ranks_with_no_common_fabric_fail_alike() {
    let started = Instant::now();
    let children = rendezvous(2, &["-n", "10"], |r| {
        vec![("FI_PROVIDER", if r == 0 { "shm" } else { "tcp" }.to_string())]
    });
    let exits = wait_all(children, started, DEADLINE);
    for (r, e) in exits.iter().enumerate() {
        assert!(!e.status.success(), "rank {r}: {e:?}");
        assert!(
            e.stderr
                .contains(&format!("rank 0 cannot open tcp via {} (rdm)", best_tcp())),
            "rank {r}: {}",
            e.stderr
        );
    }
}

#[test]
fn a_rank_that_never_starts_is_an_error_not_a_hang() {
    let started = Instant::now();
    let root = format!("127.0.0.1:{}", free_port());
    let children: Vec<Child> = [0, 1]
        .into_iter()
        .map(|r: u32| {
            let mut cmd = Command::new(SPMD);
            clean(&mut cmd)
                .args(["-n", "10"])
                .env("FABRIC_MSG_RANK", r.to_string())
                .env("FABRIC_MSG_SIZE", "3")
                .env("FABRIC_MSG_ROOT", &root)
                .env("FABRIC_MSG_START_TIMEOUT", "2")
                .spawn()
                .expect("spmd")
        })
        .collect();
    let exits = wait_all(children, started, DEADLINE);
    assert!(
        exits[0].stderr.contains("rank 2 did not join within 2s"),
        "{:?}",
        exits[0]
    );
    assert!(!exits[1].status.success(), "{:?}", exits[1]);
    for e in &exits {
        assert!(e.at < Duration::from_secs(15), "{e:?}");
    }
}

#[test]
fn a_partial_rendezvous_environment_says_what_is_missing() {
    let started = Instant::now();
    let mut cmd = Command::new(SPMD);
    let child = clean(&mut cmd).env("FABRIC_MSG_RANK", "0").spawn().expect("spmd");
    let e = &wait_all(vec![child], started, DEADLINE)[0];
    assert!(!e.status.success());
    assert!(
        e.stderr.contains("FABRIC_MSG_SIZE, FABRIC_MSG_ROOT not set"),
        "{}",
        e.stderr
    );
}

/// `mpirun` as root on a 2-core machine: the flags it needs, and a clean
/// environment (no rendezvous variables).
fn mpirun(args: &[&str]) -> Command {
    let mut cmd = Command::new("mpirun");
    clean(&mut cmd)
        .args(["--allow-run-as-root", "--oversubscribe"])
        .args(args);
    cmd
}

fn run_mpirun(args: &[&str]) -> Exit {
    let started = Instant::now();
    let child = mpirun(args)
        .spawn()
        .expect("mpirun (ci/setup.sh installs openmpi-bin)");
    wait_all(vec![child], started, DEADLINE).remove(0)
}

#[test]
fn mpirun_rings_on_shm_and_tcp() {
    for (n, shm, provider) in [
        (1, support::shm_on(), "shm"),
        (2, support::shm_on(), "shm"),
        (3, support::shm_on(), "shm"),
        (4, support::shm_on(), "shm"),
        (8, support::shm_on(), "shm"),
        (2, "0", best_tcp()),
        (3, "0", best_tcp()),
        (4, "0", best_tcp()),
        (8, "0", best_tcp()),
    ] {
        let np = n.to_string();
        let shm_env = format!("FABRIC_MSG_SHM={shm}");
        let e = run_mpirun(&["-x", &shm_env, "-np", &np, SPMD, "-n", "300"]);
        assert_verified_ring(&[e], n, provider, "pmix");
    }
}

#[test]
fn mpirun_ring_of_5000_without_flow_control() {
    let e = run_mpirun(&["-np", "4", SPMD, "-n", "5000"]);
    assert_verified_ring(&[e], 4, "shm", "pmix");
}

/// Issue 11's flood under mpirun (shm): 4 of 4 runs wedged with QueueFull
/// before the send backlog.
#[test]
fn mpirun_ring_flooding_unexpected_messages_completes() {
    let e = run_mpirun(&["-np", "4", SPMD, "-n", "5000", "-w", "5000", "-r", "64"]);
    assert_verified_ring(&[e], 4, "shm", "pmix");
}

/// Ranks 0 and 1 could use shm; rank 2 is held to TCP: every rank uses
/// the best TCP rung and rank 0 says why.
#[test]
fn mpirun_ranks_that_prefer_different_fabrics_agree_on_one() {
    // One command for every rank, not mpirun's `A : B` form, which Open
    // MPI 5.0.7 (Debian trixie) answers with a segfault of mpirun itself.
    let script = format!("if [ \"$PMIX_RANK\" = 2 ]; then export FI_PROVIDER=tcp; fi; exec '{SPMD}' -n 100");
    let e = run_mpirun(&["-np", "3", "sh", "-c", &script]);
    assert_verified_ring(std::slice::from_ref(&e), 3, best_tcp(), "pmix");
    let agreed = format!(
        "rank 2 can reach nothing better than tcp via {} (rdm): using it for all 3 ranks",
        best_tcp()
    );
    assert!(e.stderr.contains(&agreed), "{}", e.stderr);
}

/// A rank killed mid-ring under mpirun: the survivors say which rank is
/// lost before the launcher ends them, mpirun fails, and no rank is left.
#[test]
fn mpirun_rank_killed_mid_ring_is_named() {
    let started = Instant::now();
    let mut child = mpirun(&["-np", "4", SPMD, "-n", "100000000", "--announce"])
        .spawn()
        .expect("mpirun");
    let mpirun_pid = child.id();
    // Wait for the ring to run, then SIGKILL the rank mpirun started as rank 2.
    let watch = Watch::stdout(&mut child);
    assert!(
        watch.wait_for("ring running", 4, Duration::from_secs(60)),
        "the ranks did not all start the ring: {}",
        watch.text()
    );
    std::thread::sleep(Duration::from_millis(500));
    let ranks = children_of(mpirun_pid);
    assert_eq!(ranks.len(), 4, "mpirun's children: {ranks:?}");
    let rank2 = *ranks
        .iter()
        .find(|&&p| environ_has(p, "PMIX_RANK=2"))
        .expect("rank 2's process");
    assert!(sigkill(rank2), "SIGKILL rank 2");
    let killed = started.elapsed();
    let e = wait_all(vec![child], started, DEADLINE).remove(0);
    assert!(!e.status.success(), "{e:?}");
    assert!(e.stderr.contains("rank 2 is lost"), "{}", e.stderr);
    assert!(
        e.at.saturating_sub(killed) < LOSS_BOUND,
        "{:?} after the kill",
        e.at - killed
    );
    // Every rank is gone soon after mpirun (a zombie waiting for its reaper
    // counts as gone). mpirun may return while a rank it signalled is still
    // unwinding its address space, so "soon" is a bounded wait, not zero.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut alive = ranks.clone();
    while !alive.is_empty() && Instant::now() < deadline {
        alive.retain(|&p| process_state(p).is_some_and(|s| s != 'Z'));
        std::thread::sleep(Duration::from_millis(50));
    }
    let states: Vec<String> = alive
        .iter()
        .map(|&p| format!("{p} ({:?})", process_state(p)))
        .collect();
    assert!(
        alive.is_empty(),
        "ranks outlived mpirun by 5 s: {states:?}; mpirun stderr:\n{}",
        e.stderr
    );
}
