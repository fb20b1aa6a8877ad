//! The World under Slurm: `spmd` launched by `srun --mpi=pmix` on the
//! one-node cluster `ci/slurm.sh` starts (once per test binary, reused when
//! it is already up), on shm and on TCP; a rank killed mid-ring; and the
//! programming model's `model_check`.
//!
//! Skipped, loudly, only where Slurm cannot run (not root, packages
//! absent); under `CI=true` that fails instead.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};
use support::slurm::{cluster, srun};
use support::{
    assert_verified_ring, best_tcp, process_state, processes_with, remove_shm_regions, sigkill, wait_all,
    Watch,
};

const SPMD: &str = env!("CARGO_BIN_EXE_spmd");
const MODEL_CHECK: &str = env!("CARGO_BIN_EXE_model_check");
/// Longest any one launch may take.
const DEADLINE: Duration = Duration::from_secs(90);
/// How soon the survivors of a lost rank must have said so and exited: the
/// bound `docs/world.md` states for the World.
const LOSS_BOUND: Duration = Duration::from_secs(12);

#[test]
fn srun_rings_on_shm_and_tcp() {
    let Some(conf) = cluster() else { return };
    for (n, shm) in [
        (1, true),
        (2, true),
        (4, true),
        (8, true),
        (1, false),
        (2, false),
        (4, false),
        (8, false),
    ] {
        let started = Instant::now();
        let child = srun(conf, SPMD, n, shm, &[], &["-n", "300"], &[]);
        let e = wait_all(vec![child], started, DEADLINE).remove(0);
        let provider = if shm { "shm" } else { best_tcp() };
        assert_verified_ring(std::slice::from_ref(&e), n, provider, "pmix");
        eprintln!("srun -n {n} (FABRIC_MSG_SHM={}): {:?}", u8::from(shm), e.at);
    }
}

/// The programming model's check (`model.rs` runs it under mpirun and the
/// rendezvous): communicators, typed requests and serde messages, 3 ranks.
#[test]
fn srun_model_check() {
    let Some(conf) = cluster() else { return };
    let started = Instant::now();
    let child = srun(conf, MODEL_CHECK, 3, true, &[], &[], &[]);
    let e = wait_all(vec![child], started, DEADLINE).remove(0);
    let text = format!("{}{}", e.stdout, e.stderr);
    assert!(e.status.success(), "model_check under srun: {text}");
    for r in 0..3 {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("rank {r}/3: ")) && l.ends_with("checks passed")),
            "rank {r}: {text}"
        );
    }
}

/// 5000 messages per rank with a window of 64 and no flow control, as the
/// mpirun and rendezvous tests run it.
#[test]
fn srun_ring_of_5000_without_flow_control() {
    let Some(conf) = cluster() else { return };
    let started = Instant::now();
    let child = srun(conf, SPMD, 4, true, &[], &["-n", "5000"], &[]);
    let e = wait_all(vec![child], started, DEADLINE).remove(0);
    assert_verified_ring(&[e], 4, "shm", "pmix");
}

/// A rank SIGKILLed mid-ring under srun: every other rank names it within
/// the World's bound (each rank's stderr goes to its own file, so a rank
/// that said nothing is seen), srun fails, and no rank outlives it.
#[test]
fn srun_rank_killed_mid_ring_is_named_by_every_other() {
    let Some(conf) = cluster() else { return };
    for shm in [true, false] {
        killed_mid_ring(conf, shm);
    }
}

fn killed_mid_ring(conf: &str, shm: bool) {
    const N: u32 = 4;
    const VICTIM: u32 = 2;
    let mark = format!("{}-{}", std::process::id(), u8::from(shm));
    let marker = format!("FABRIC_MSG_TEST_JOB={mark}");
    let dir: PathBuf = std::env::temp_dir().join(format!("fabric-msg-srun-{mark}"));
    std::fs::create_dir_all(&dir).expect("a directory for the ranks' stderr");
    let pattern = format!("--error={}/rank%t.err", dir.display());
    let started = Instant::now();
    let mut child = srun(
        conf,
        SPMD,
        N,
        shm,
        &[&pattern],
        &["-n", "100000000", "--announce"],
        &[("FABRIC_MSG_TEST_JOB", &mark)],
    );

    // Once every rank runs the ring (start-up takes seconds on a loaded
    // machine), let it run. The ranks are slurmstepd's children, not
    // srun's: find them by the variable srun passed on.
    let watch = Watch::stdout(&mut child);
    let ring_runs = watch.wait_for("ring running", N as usize, Duration::from_secs(60));
    if ring_runs {
        std::thread::sleep(Duration::from_millis(500));
    }
    let rank_of = |p: u32| (0..N).find(|r| support::environ_has(p, &format!("PMIX_RANK={r}")));
    let mut ranks: Vec<u32> = processes_with(&marker)
        .into_iter()
        .filter(|&p| rank_of(p).is_some())
        .collect();
    ranks.sort_by_key(|&p| rank_of(p));
    let running = |p: &u32| process_state(*p).is_some_and(|s| s != 'Z');
    let victim = match ranks.get(VICTIM as usize).filter(|p| running(p)) {
        Some(&p) if ring_runs && ranks.len() == N as usize && sigkill(p) => p,
        _ => {
            // Not left running: srun passes SIGTERM on to the step.
            support::sigterm(child.id());
            let _ = child.wait();
            panic!(
                "srun's ranks {ranks:?}: rank {VICTIM} not found running, or not killed; stdout: {}",
                watch.text()
            );
        }
    };
    let killed = Instant::now();

    // When each survivor ends (a zombie awaiting its reaper has ended).
    let mut ended: Vec<Option<Duration>> = vec![None; N as usize];
    ended[VICTIM as usize] = Some(Duration::ZERO);
    while ended.iter().any(Option::is_none) && killed.elapsed() < LOSS_BOUND + Duration::from_secs(5) {
        for (r, &p) in ranks.iter().enumerate() {
            if ended[r].is_none() && !process_state(p).is_some_and(|s| s != 'Z') {
                ended[r] = Some(killed.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let e = wait_all(vec![child], started, DEADLINE).remove(0);
    let srun_after = e.at.saturating_sub(killed.duration_since(started));
    let said: Vec<String> = (0..N)
        .map(|r| std::fs::read_to_string(dir.join(format!("rank{r}.err"))).unwrap_or_default())
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    remove_shm_regions(victim);

    let context =
        format!("shm={shm}; srun: {e:?}; ends after the kill: {ended:?}; stderr by rank: {said:#?}");
    assert!(!e.status.success(), "srun succeeded: {context}");
    for r in (0..N).filter(|&r| r != VICTIM) {
        assert!(
            said[r as usize].contains(&format!("rank {VICTIM} is lost")),
            "rank {r} did not name rank {VICTIM}: {context}"
        );
        let at = ended[r as usize].unwrap_or_else(|| panic!("rank {r} still running: {context}"));
        assert!(at < LOSS_BOUND, "rank {r} took {at:?} to give up: {context}");
    }
    assert!(
        srun_after < LOSS_BOUND,
        "srun ended {srun_after:?} after the kill: {context}"
    );
    // No rank outlives srun: slurmstepd reaps its tasks before the step
    // ends, so a short bounded wait is all a rank may take.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut alive = ranks.clone();
    while !alive.is_empty() && Instant::now() < deadline {
        alive.retain(|&p| process_state(p).is_some_and(|s| s != 'Z'));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        alive.is_empty(),
        "ranks {alive:?} outlived srun by 5 s: {context}"
    );
    eprintln!("shm={shm}: rank {VICTIM} killed; ranks ended after {ended:?}, srun after {srun_after:?}");
}
