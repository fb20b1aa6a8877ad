//! Programs written as a user would, beside their C + MPI twins: both run
//! under `mpirun` with the same arguments and must print the same numbers
//! (`jacobi`: the field's sum bit for bit, the residual to the digits
//! printed; `dht`: the checksum of every value looked up, and no key
//! missing; `sgd`: the loss to the digits printed, the fit as close to the
//! optimum, and one model on every rank). The C twin is built with `mpicc` (openmpi's `libopenmpi-dev`,
//! which ci/setup.sh installs).

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{clean, wait_all};

const JACOBI: &str = env!("CARGO_BIN_EXE_jacobi");
const DHT: &str = env!("CARGO_BIN_EXE_dht");
const SGD: &str = env!("CARGO_BIN_EXE_sgd");
const DEADLINE: Duration = Duration::from_secs(120);

/// The C twin `examples/mpi/NAME.c`, built into the target directory.
fn build_twin(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}_mpi"));
    let status = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(root.join("mpi").join(format!("{name}.c")))
        .arg("-lm")
        .status()
        .expect("mpicc (ci/setup.sh installs libopenmpi-dev)");
    assert!(status.success(), "mpicc {name}.c failed");
    out
}

/// `mpirun -np N PROGRAM ARGS`: the line starting with `prefix`.
fn run(program: &str, n: u32, args: &[&str], prefix: &str) -> String {
    run_with(&[], program, n, args, prefix)
}

/// `run` with more options for `mpirun` (Open MPI's MCA parameters).
fn run_with(options: &[&str], program: &str, n: u32, args: &[&str], prefix: &str) -> String {
    let mut cmd = Command::new("mpirun");
    clean(&mut cmd)
        .args(["--allow-run-as-root", "--oversubscribe"])
        .args(options)
        .args(["-np", &n.to_string(), program])
        .args(args);
    let e = wait_all(vec![cmd.spawn().expect("mpirun")], Instant::now(), DEADLINE).remove(0);
    assert!(e.status.success(), "{program}: {e:?}");
    e.stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("{program} printed no {prefix:?} line: {}", e.stdout))
        .to_string()
}

/// The numbers after `sum` and `residual`.
fn numbers(line: &str) -> (f64, f64) {
    let after = |key: &str| -> f64 {
        let w: Vec<&str> = line.split_whitespace().collect();
        let i = w
            .iter()
            .position(|x| *x == key)
            .unwrap_or_else(|| panic!("no {key} in {line}"));
        w[i + 1].parse().unwrap_or_else(|_| panic!("{key} in {line}"))
    };
    (after("sum"), after("residual"))
}

#[test]
fn jacobi_agrees_with_its_mpi_twin() {
    let twin = build_twin("jacobi");
    for (n, cells, steps) in [(1, "64", "100"), (3, "300", "200"), (4, "1000", "500")] {
        let ours = run(JACOBI, n, &[cells, steps], "jacobi:");
        let theirs = run(twin.to_str().unwrap_or_default(), n, &[cells, steps], "jacobi:");
        let ((s1, r1), (s2, r2)) = (numbers(&ours), numbers(&theirs));
        assert_eq!(s1.to_bits(), s2.to_bits(), "the field's sum:\n{ours}\n{theirs}");
        assert!(
            (r1 - r2).abs() <= r2.abs() * 1e-5,
            "the residual:\n{ours}\n{theirs}"
        );
        assert!(s1 > 0.0, "heat flowed in: {ours}");
    }
}

/// The word after `key` in `line`.
fn word<'a>(line: &'a str, key: &str) -> &'a str {
    let w: Vec<&str> = line.split_whitespace().collect();
    let i = w
        .iter()
        .position(|x| *x == key)
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    w.get(i + 1).copied().unwrap_or_default()
}

/// The hash table on symmetric memory: both programs find every key with
/// its value (the same checksum, none missing), including with a table
/// small enough that most inserts probe past taken slots. Open MPI runs
/// the twin's window on `osc/sm`, its on-node one-sided component (here
/// 4.1.4's default choice, `osc/rdma` over vader, crashed the twin in
/// `MPI_Barrier` at 3 ranks, 3 runs of 3).
#[test]
fn dht_agrees_with_its_mpi_twin() {
    let twin = build_twin("dht");
    for (n, keys, slots) in [(1, "500", "1001"), (3, "4000", "8001"), (4, "3000", "3100")] {
        let ours = run(DHT, n, &[keys, slots], "dht");
        let twin = twin.to_str().unwrap_or_default();
        let theirs = run_with(&["--mca", "osc", "sm"], twin, n, &[keys, slots], "dht");
        let k: u64 = keys.parse().unwrap_or_default();
        let total = k * u64::from(n);
        let want = 3 * total * (total + 1) / 2;
        for line in [&ours, &theirs] {
            assert_eq!(word(line, "checksum"), want.to_string(), "{line}");
            assert_eq!(word(line, "missing"), "0", "{line}");
        }
    }
}

/// The number after `key` in `line`.
fn number(line: &str, key: &str) -> f64 {
    word(line, key)
        .parse()
        .unwrap_or_else(|_| panic!("{key} in {line}"))
}

/// Data-parallel training's gradient allreduce: buckets of a gradient
/// summed by non-blocking allreduces, started in the backward pass's order
/// and waited for together. Both programs reach the same loss (to the
/// digits printed: the sums' order may differ between the two, so not bit
/// for bit), the same distance from the optimum, and every rank holds the
/// same model. Buckets that do not divide the parameters evenly, one
/// bucket, and more buckets than fit in the node's collective slots at
/// once; ranks on one node and on two pretend nodes.
#[test]
fn sgd_agrees_with_its_mpi_twin() {
    let twin = build_twin("sgd");
    let twin = twin.to_str().unwrap_or_default();
    for (n, params, steps, buckets) in [
        (1, "1000", "20", "3"),
        (2, "100000", "20", "1"),
        (3, "10007", "30", "7"),
        (4, "50000", "20", "64"),
    ] {
        let args = [params, steps, buckets];
        let theirs = run(twin, n, &args, "sgd:");
        let mut ours = vec![run(SGD, n, &args, "sgd:")];
        if n == 4 {
            // Two pretend nodes of two ranks: the World's fabric between
            // them, its node transport within each.
            let mut cmd = Command::new("mpirun");
            let program = format!(
                "FABRIC_MSG_NODE=node$((OMPI_COMM_WORLD_RANK / 2)) exec {SGD} {}",
                args.join(" ")
            );
            clean(&mut cmd).args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                "4",
                "sh",
                "-c",
                &program,
            ]);
            let e = wait_all(vec![cmd.spawn().expect("mpirun")], Instant::now(), DEADLINE).remove(0);
            assert!(e.status.success(), "sgd on pretend nodes: {e:?}");
            let line = e.stdout.lines().find(|l| l.starts_with("sgd:"));
            ours.push(
                line.unwrap_or_else(|| panic!("no sgd: line: {}", e.stdout))
                    .to_string(),
            );
        }
        let (loss, error) = (number(&theirs, "loss"), number(&theirs, "error"));
        assert_eq!(word(&theirs, "same"), "yes", "{theirs}");
        for line in &ours {
            assert_eq!(
                word(line, "same"),
                "yes",
                "every rank holds the same model:\n{line}"
            );
            let l = number(line, "loss");
            assert!(
                (l - loss).abs() <= loss.abs() * 1e-5 + 1e-9,
                "the loss:\n{line}\n{theirs}"
            );
            let e = number(line, "error");
            assert!(
                e <= error * 2.0 + 1e-6,
                "the distance from the optimum:\n{line}\n{theirs}"
            );
        }
    }
}
