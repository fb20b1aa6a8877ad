//! Bounded fuzzing in the test suite: every decoder that takes bytes from a
//! peer, a launcher or a file (`fabric_msg::fuzzing`) gets random bytes and
//! mutations of real inputs (what fabric-msg itself sends, the shipped
//! `providers.toml`). None may panic, and none may make an allocation
//! larger than its input allows: a peer cannot make us reserve memory by
//! announcing a length it never sends. The long runs are cargo-fuzz's
//! (`fabric-msg/fuzz/`, `ci/fuzz.sh`); a failure proptest finds is kept in
//! `tests/fuzz_decoders.proptest-regressions` and replayed first.
//!
//! Cases per target: `PROPTEST_CASES` (default 1000, a few seconds).

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Tracks the largest single allocation of the current thread.
struct Largest;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: the thread's slot may already be gone while it exits.
    let _ = LARGEST.try_with(|m| {
        if size > m.get() {
            m.set(size)
        }
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// bookkeeping only touches a const-initialised thread-local Cell, which
// neither allocates nor has a destructor.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// The largest allocation `f` makes on this thread.
fn largest_during(f: impl FnOnce()) -> usize {
    LARGEST.with(|m| m.set(0));
    f();
    LARGEST.with(|m| m.get())
}

/// What a decoder may allocate at most for `input`: a fixed allowance for
/// its own bookkeeping plus a few times what was actually sent.
fn allowance(input: &[u8]) -> usize {
    64 * 1024 + 8 * input.len()
}

/// One change to an input.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize, usize),
    Truncate(usize),
    /// A varint of the largest length, where a length would be.
    HugeLength(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1..16usize).prop_map(|(i, n)| Mutation::Remove(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
        any::<usize>().prop_map(Mutation::HugeLength),
    ]
}

fn apply(mut b: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let at = |i: usize, n: usize| if n == 0 { 0 } else { i % n };
        match *m {
            Mutation::Flip(i, x) if !b.is_empty() => {
                let i = at(i, b.len());
                b[i] ^= x;
            }
            Mutation::Insert(i, x) => {
                let i = at(i, b.len() + 1);
                b.insert(i, x);
            }
            Mutation::Remove(i, n) if !b.is_empty() => {
                let i = at(i, b.len());
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Mutation::Truncate(i) => {
                let n = at(i, b.len() + 1);
                b.truncate(n);
            }
            Mutation::HugeLength(i) => {
                let i = at(i, b.len() + 1);
                let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
                b.splice(i..i, huge);
            }
            _ => {}
        }
    }
    b
}

fn check(name: &str, f: fn(&[u8]), input: &[u8]) -> Result<(), TestCaseError> {
    let largest = largest_during(|| f(input));
    prop_assert!(
        largest <= allowance(input),
        "{name}: an allocation of {largest} bytes for {} bytes of input",
        input.len()
    );
    Ok(())
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1000);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

/// Every target runs its seeds unchanged (they must be real inputs, or the
/// mutations below start from nothing) and every input that once crashed
/// a long run (`fabric-msg/fuzz/regressions/TARGET/`). With
/// `FABRIC_MSG_FUZZ_SEEDS=DIR` the seeds are also written to `DIR/TARGET/`
/// as the long runs' starting corpus (`ci/fuzz.sh`).
#[test]
fn seeds_and_regressions() {
    let write_to = std::env::var_os("FABRIC_MSG_FUZZ_SEEDS").map(std::path::PathBuf::from);
    let regressions = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    for (name, f, seeds) in fabric_msg::fuzzing::targets() {
        assert!(!seeds.is_empty(), "{name} has no seeds");
        for (i, s) in seeds.iter().enumerate() {
            check(name, f, s).unwrap_or_else(|e| panic!("seed {i}: {e}"));
            if let Some(dir) = &write_to {
                let dir = dir.join(name);
                std::fs::create_dir_all(&dir).expect("seed directory");
                std::fs::write(dir.join(format!("seed-{i}")), s).expect("writing a seed");
            }
        }
        let Ok(kept) = std::fs::read_dir(regressions.join(name)) else {
            continue;
        };
        for entry in kept.flatten() {
            let input = std::fs::read(entry.path()).expect("reading a regression input");
            check(name, f, &input).unwrap_or_else(|e| panic!("{}: {e}", entry.path().display()));
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes(target in 0..fabric_msg::fuzzing::targets().len(),
                    bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let (name, f, _) = &fabric_msg::fuzzing::targets()[target];
        check(name, *f, &bytes)?;
    }

    #[test]
    fn mutated_seeds(target in 0..fabric_msg::fuzzing::targets().len(),
                     seed in any::<usize>(),
                     ms in proptest::collection::vec(mutation(), 1..8)) {
        let (name, f, seeds) = &fabric_msg::fuzzing::targets()[target];
        let input = apply(seeds[seed % seeds.len()].clone(), &ms);
        check(name, *f, &input)?;
    }
}

/// Deterministic sweep: a length of 2^64 − 1 and one of 2^20 announced at
/// every position of every seed (where a peer would announce a vector's or
/// a string's length) reserves nothing beyond the allowance.
#[test]
fn announced_lengths_reserve_nothing() {
    let lengths: [&[u8]; 2] = [
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        &[0x80, 0x80, 0x40],
    ];
    for (name, f, seeds) in fabric_msg::fuzzing::targets() {
        for seed in &seeds {
            for at in 0..=seed.len() {
                for len in lengths {
                    let mut input = seed.clone();
                    input.splice(at..at, len.iter().copied());
                    let largest = largest_during(|| f(&input));
                    assert!(
                        largest <= allowance(&input),
                        "{name}: {largest} bytes allocated for {} bytes of input with a length announced at byte {at}",
                        input.len()
                    );
                }
            }
        }
    }
}
