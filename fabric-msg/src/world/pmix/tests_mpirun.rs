use std::process::{Command, Output};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::client::Pmix;
use super::error::PmixError;
use super::load::API;
use super::nb::ABANDONED_COMPLETIONS;

// -----------------------------------------------------------------------
// Under a real launcher
// -----------------------------------------------------------------------

/// Set (to the child test's name) in processes the tests below start.
pub(super) const CHILD_ENV: &str = "FABRIC_MSG_PMIX_TEST_CHILD";
const CHILD_OK: &str = "PMIX-CHILD-OK";

/// Is this process the `name` child of one of the tests below?
fn child_mode(name: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(name)
}

/// `name`'s path as the test harness knows it (`name` is a test of this
/// module).
pub(super) fn test_path(name: &str) -> String {
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, rest)| rest);
    format!("{module}::{name}")
}

/// The test binary's arguments that run child role `name` alone (roles are
/// `#[ignore]`d, so a plain `cargo test` does not count them).
pub(super) fn role_args(name: &str) -> [String; 5] {
    [
        test_path(name),
        "--exact".into(),
        "--ignored".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
}

pub(super) fn describe(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs the child test `child` as `np` ranks under mpirun, all of it
/// bounded by `limit`. As root mpirun needs `--allow-run-as-root`; with
/// more ranks than cores, `--oversubscribe`.
fn mpirun(np: u32, child: &str, limit: Duration) -> Output {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new("timeout")
        .args(["--kill-after=10", &limit.as_secs().to_string()])
        .args([
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &np.to_string(),
            "-x",
            CHILD_ENV,
        ])
        .arg(&exe)
        .args(role_args(child))
        .env(CHILD_ENV, child)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `timeout` (coreutils): {e}"));
    match out.status.code() {
        Some(127) => panic!(
            "mpirun not found: install openmpi-bin (Debian/Ubuntu)\n{}",
            describe(&out)
        ),
        Some(124) => panic!("mpirun ran past {limit:?} and was stopped\n{}", describe(&out)),
        _ => out,
    }
}

/// The connection of a child that mpirun started.
fn connect_child() -> Pmix {
    match Pmix::connect(Duration::from_secs(30)) {
        Ok(Some(pmix)) => pmix,
        Ok(None) => panic!("mpirun set no PMIx variables"),
        Err(e) => panic!("{e}"),
    }
}

/// Asserts the launcher succeeded and every rank printed its OK line once.
pub(super) fn assert_ranks_ok(out: &Output, child: &str, np: u32) {
    assert!(out.status.success(), "the launcher failed\n{}", describe(out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for rank in 0..np {
        let line = format!("{CHILD_OK} {child} rank={rank} ");
        // libtest's "test ... " may precede it on the same line.
        let count = stdout.lines().filter(|l| l.contains(&line)).count();
        assert_eq!(
            count,
            1,
            "rank {rank} printed {count} OK lines\n{}",
            describe(out)
        );
    }
}

const EXCHANGE_KEY: &str = "fabric-msg.test.blob";

/// The blob rank `rank` publishes: its length and every byte depend on
/// the rank.
fn blob(rank: u32) -> Vec<u8> {
    (0..300 + 97 * rank as usize)
        .map(|i| (i as u32 * 31 + rank * 17 + (i as u32 >> 8)) as u8)
        .collect()
}

#[test]
fn mpirun_three_ranks_exchange() {
    let out = mpirun(3, "child_exchange", Duration::from_secs(90));
    assert_ranks_ok(&out, "child_exchange", 3);
}

#[test]
#[ignore = "child role: run by mpirun_ and srun_three_ranks_exchange under the launcher"]
fn child_exchange() {
    if !child_mode("child_exchange") {
        return; // a no-op unless mpirun_ or srun_three_ranks_exchange started us
    }
    let pmix = connect_child();
    let rank = pmix.rank();
    let size = pmix.job_size().expect("job size");
    assert_eq!(size, 3);
    assert!(rank < size);
    assert!(!pmix.namespace().is_empty());
    let peers = pmix.local_peers().expect("local peers");
    assert!(peers.contains(&rank), "{peers:?}");
    assert_eq!(peers.len(), 3, "one node runs every rank: {peers:?}");
    let local_rank = pmix.local_rank().expect("local rank");
    assert!(
        usize::from(local_rank) < peers.len(),
        "local rank {local_rank}, peers {peers:?}"
    );
    let host = pmix.hostname().expect("host name");
    assert!(!host.is_empty());

    let second = Pmix::connect(Duration::from_secs(30)).expect_err("a second connect must be refused");
    assert!(
        matches!(second, PmixError::AlreadyUsed { finalized: false }),
        "{second}"
    );
    assert!(matches!(
        pmix.put("pmix.mine", b"x"),
        Err(PmixError::InvalidArgument { .. })
    ));
    assert!(matches!(
        pmix.put("nul\0key", b"x"),
        Err(PmixError::InvalidArgument { .. })
    ));
    assert!(matches!(
        pmix.get(size, EXCHANGE_KEY, 10, Duration::from_secs(1)),
        Err(PmixError::InvalidArgument { .. })
    ));

    pmix.put(EXCHANGE_KEY, &blob(rank)).expect("put");
    pmix.commit().expect("commit");
    pmix.fence(true, Duration::from_secs(30)).expect("fence");
    for peer in (0..size).filter(|&r| r != rank) {
        let expected = blob(peer);
        let got = pmix
            .get(peer, EXCHANGE_KEY, 4096, Duration::from_secs(10))
            .expect("get");
        assert_eq!(got.len(), expected.len(), "length of rank {peer}'s blob");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "byte {i} of rank {peer}'s blob");
        }
        let err = pmix
            .get(peer, EXCHANGE_KEY, 10, Duration::from_secs(10))
            .expect_err("over-long value");
        assert!(err.to_string().contains("more than the 10 allowed"), "{err}");
        let err = pmix
            .get(peer, "pmix.hname", 4096, Duration::from_secs(10))
            .expect_err("a string");
        assert!(err.to_string().contains("expected a byte object"), "{err}");
    }
    pmix.finalize().expect("finalize");
    let again = Pmix::connect(Duration::from_secs(30)).expect_err("PMIx cannot be initialised twice");
    assert!(
        matches!(again, PmixError::AlreadyUsed { finalized: true }),
        "{again}"
    );
    println!("{CHILD_OK} child_exchange rank={rank} size={size} local_rank={local_rank} peers={peers:?} host={host}");
}

/// Our own deadline for the timeout test: not whole seconds, so it
/// passes before the server's `PMIX_TIMEOUT` (3 s).
const BOUND: Duration = Duration::from_millis(2500);
const SLACK: Duration = Duration::from_millis(1500);

#[test]
fn mpirun_fence_and_get_time_out() {
    let out = mpirun(3, "child_fence_timeout", Duration::from_secs(90));
    assert_ranks_ok(&out, "child_fence_timeout", 3);
}

#[test]
#[ignore = "child role: run by mpirun_fence_and_get_time_out under mpirun"]
fn child_fence_timeout() {
    if !child_mode("child_fence_timeout") {
        return; // a no-op unless mpirun_fence_and_get_time_out started us
    }
    let pmix = connect_child();
    let rank = pmix.rank();
    if rank == 2 {
        // Never fences, never puts; outlives what the others do.
        std::thread::sleep(BOUND * 4);
        println!("{CHILD_OK} child_fence_timeout rank={rank} stayed away");
        return;
    }
    let start = Instant::now();
    let err = pmix
        .fence(false, BOUND)
        .expect_err("the fence completed without rank 2");
    let fence_took = start.elapsed();
    assert!(err.is_timeout() && err.call() == Some("PMIx_Fence"), "{err}");
    assert!(err.to_string().contains("PMIx_Fence"), "{err}");
    assert!(
        fence_took >= BOUND && fence_took <= BOUND + SLACK,
        "the fence took {fence_took:?}: {err}"
    );

    // The server gives up at 3 s and calls back into the request we
    // abandoned: that must be harmless.
    let wait = Instant::now();
    while ABANDONED_COMPLETIONS.load(Ordering::Relaxed) == 0 && wait.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let late = ABANDONED_COMPLETIONS.load(Ordering::Relaxed);
    assert!(
        late >= 1,
        "the server never answered the abandoned fence (PMIX_TIMEOUT 3 s)"
    );

    let start = Instant::now();
    let err = pmix
        .get(2, "fabric-msg.test.never-put", 64, BOUND)
        .expect_err("rank 2 never put this");
    let get_took = start.elapsed();
    assert!(err.is_timeout() && err.to_string().contains("PMIx_Get"), "{err}");
    assert!(
        get_took >= BOUND && get_took <= BOUND + SLACK,
        "the get took {get_took:?}: {err}"
    );
    println!("{CHILD_OK} child_fence_timeout rank={rank} fence={fence_took:?} get={get_took:?} late_callbacks={late}");
}

#[test]
fn mpirun_abort_ends_the_job() {
    let start = Instant::now();
    let out = mpirun(3, "child_abort", Duration::from_secs(60));
    assert_aborted(&out, start.elapsed(), "mpirun");
}

/// `child_abort` ended the job: `launcher` exited with the abort's status
/// 7 within 20 s, the abort's message reached stderr, and no rank survived.
pub(super) fn assert_aborted(out: &Output, took: Duration, launcher: &str) {
    assert_eq!(
        out.status.code(),
        Some(7),
        "{launcher} should exit with the abort status\n{}",
        describe(out)
    );
    assert!(
        took < Duration::from_secs(20),
        "the job took {took:?} to end\n{}",
        describe(out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("aborts the job (status 7): fabric-msg test abort"),
        "{}",
        describe(out)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("survived"),
        "{}",
        describe(out)
    );
}

#[test]
#[ignore = "child role: run by mpirun_ and srun_abort_ends_the_job under the launcher"]
fn child_abort() {
    if !child_mode("child_abort") {
        return; // a no-op unless mpirun_ or srun_abort_ends_the_job started us
    }
    let pmix = connect_child();
    if pmix.rank() == 1 {
        assert!(matches!(
            pmix.abort(7, "nul\0inside"),
            Err(PmixError::InvalidArgument { .. })
        ));
        pmix.abort(7, "fabric-msg test abort").expect("abort");
    }
    std::thread::sleep(Duration::from_secs(30));
    println!("rank {} survived the abort", pmix.rank());
}

#[test]
fn connect_without_pmix_env_returns_none() {
    // In a child process: removing variables from this one would race
    // with the other tests.
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args(role_args("child_without_pmix"))
        .env(CHILD_ENV, "child_without_pmix");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PMIX_") {
            cmd.env_remove(name);
        }
    }
    let out = cmd.output().expect("run the test binary");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{CHILD_OK} child_without_pmix")),
        "{}",
        describe(&out)
    );
}

#[test]
#[ignore = "child role: run by connect_without_pmix_env_returns_none through current_exe()"]
fn child_without_pmix() {
    if !child_mode("child_without_pmix") {
        return; // a no-op unless connect_without_pmix_env_returns_none started us
    }
    assert!(Pmix::connect(Duration::from_secs(30))
        .expect("connect without PMIx")
        .is_none());
    assert!(
        API.get().is_none(),
        "libpmix was loaded although no launcher asked for it"
    );
    println!("{CHILD_OK} child_without_pmix");
}
