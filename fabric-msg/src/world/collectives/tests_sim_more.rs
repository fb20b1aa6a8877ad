//! The schedules of scatter, alltoall and scan, run in memory for every
//! world size of `tests_sim.rs` against a sequential reference, with the
//! same checks: each message received once, by the rank and step it was
//! meant for, with the length the receiver expects, and no rank waiting for
//! ever.

use super::ops::Op;
use super::ops::Reduction;
use super::plan::Plan;
use super::request::extract;
use super::schedule::Schedule;
use super::tests_sim::{counts, op_i64, run, simulate, values, Rng, SIZES};
use super::{alltoall, scan, scatter};

/// Every rank's schedule and working array (from each rank's data).
fn start(plans: &[Plan], data: &[Vec<i64>]) -> (Vec<Schedule>, Vec<Vec<i64>>) {
    let scheds = plans.iter().map(|p| p.sched.clone()).collect();
    let works = plans
        .iter()
        .zip(data)
        .map(|(p, d)| p.work(d.clone()).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    (scheds, works)
}

/// Every rank's result.
fn results(plans: &[Plan], outs: Vec<Vec<i64>>) -> Vec<Vec<i64>> {
    plans
        .iter()
        .zip(outs)
        .map(|(p, w)| extract(w, &p.shape))
        .collect()
}

#[test]
fn scatterv_gives_each_rank_its_block_of_the_roots_data() {
    let mut rng = Rng(11);
    for p in SIZES {
        for algo in [scatter::Algorithm::Binomial, scatter::Algorithm::Linear] {
            for _ in 0..3 {
                let root = rng.below(u64::from(p)) as u32;
                let c = counts(&mut rng, p);
                let blocks: Vec<Vec<i64>> = c.iter().map(|&n| values(&mut rng, n)).collect();
                let plans: Vec<Plan> = (0..p).map(|r| scatter::schedule(r, p, root, &c, algo)).collect();
                // Only the root's data is read: the others pass nothing.
                let data: Vec<Vec<i64>> = (0..p)
                    .map(|r| if r == root { blocks.concat() } else { vec![] })
                    .collect();
                let (scheds, works) = start(&plans, &data);
                let got = results(&plans, run(&scheds, works, None));
                for r in 0..p as usize {
                    assert_eq!(
                        got[r], blocks[r],
                        "{algo:?}, {p} ranks, root {root}, counts {c:?}, rank {r}"
                    );
                }
            }
        }
    }
    assert_eq!(scatter::choose(1000, 2), scatter::Algorithm::Linear);
    assert_eq!(scatter::choose(3 * 1000, 3), scatter::Algorithm::Binomial);
    assert_eq!(
        scatter::choose(4 * (super::gather::BINOMIAL_MAX_BYTES + 1), 4),
        scatter::Algorithm::Linear
    );
}

/// A random matrix of counts, `m[from][to]`, a quarter of them 0.
fn matrix(rng: &mut Rng, p: u32) -> Vec<Vec<usize>> {
    (0..p).map(|_| counts(rng, p)).collect()
}

#[test]
fn alltoallv_gives_each_rank_every_ranks_block_for_it_in_rank_order() {
    let mut rng = Rng(12);
    for p in SIZES {
        for even in [false, true] {
            let m = if even {
                let n = rng.below(5) as usize;
                vec![vec![n; p as usize]; p as usize]
            } else {
                matrix(&mut rng, p)
            };
            // block[from][to]
            let block: Vec<Vec<Vec<i64>>> = m
                .iter()
                .map(|row| row.iter().map(|&n| values(&mut rng, n)).collect())
                .collect();
            let recv = |r: usize| (0..p as usize).map(|q| m[q][r]).collect::<Vec<_>>();
            let plans: Vec<Plan> = (0..p as usize)
                .map(|r| alltoall::schedule(r as u32, p, &m[r], &recv(r)))
                .collect();
            let data: Vec<Vec<i64>> = block.iter().map(|row| row.concat()).collect();
            let (scheds, works) = start(&plans, &data);
            let got = results(&plans, run(&scheds, works, None));
            for r in 0..p as usize {
                let want: Vec<i64> = (0..p as usize).flat_map(|q| block[q][r].clone()).collect();
                assert_eq!(got[r], want, "{p} ranks, counts {m:?}, rank {r}");
            }
        }
    }
}

/// A rank whose receive count for a peer differs from what that peer
/// sends is stopped by the length check of the receive.
#[test]
fn alltoallv_counts_that_disagree_are_seen_as_a_length_mismatch() {
    let mut rng = Rng(13);
    for p in [2u32, 3, 5, 8] {
        let m = matrix(&mut rng, p);
        let mut recv: Vec<Vec<usize>> = (0..p as usize)
            .map(|r| (0..p as usize).map(|q| m[q][r]).collect())
            .collect();
        recv[1][0] += 1;
        let plans: Vec<Plan> = (0..p as usize)
            .map(|r| alltoall::schedule(r as u32, p, &m[r], &recv[r]))
            .collect();
        let data: Vec<Vec<i64>> = m.iter().map(|row| vec![7; row.iter().sum()]).collect();
        let (scheds, works) = start(&plans, &data);
        let e = simulate(&scheds, works, None, &[]).unwrap_err();
        assert!(
            e.contains("rank 1 expects") && e.contains("from 0"),
            "{p} ranks: {e}"
        );
    }
}

/// `x ⊕ y` = "x, then y" for affine maps `v ↦ a·v + b` mod 2^32 packed as
/// `a << 32 | b`: associative, not commutative.
fn then(x: i64, y: i64) -> i64 {
    let (xa, xb) = ((x as u64) >> 32, (x as u64) & 0xffff_ffff);
    let (ya, yb) = ((y as u64) >> 32, (y as u64) & 0xffff_ffff);
    let a = xa.wrapping_mul(ya) & 0xffff_ffff;
    let b = (ya.wrapping_mul(xb).wrapping_add(yb)) & 0xffff_ffff;
    ((a << 32) | b) as i64
}

/// Prefixes of `inputs` folded with `f`: element `r` combines ranks
/// `0..=r` (inclusive) or `0..r` (exclusive; rank 0: nothing).
fn prefixes(inputs: &[Vec<i64>], kind: scan::Kind, f: impl Fn(i64, i64) -> i64) -> Vec<Vec<i64>> {
    let mut out = Vec::new();
    let mut acc: Option<Vec<i64>> = None;
    for v in inputs {
        let next = match &acc {
            None => v.clone(),
            Some(a) => a.iter().zip(v).map(|(x, y)| f(*x, *y)).collect(),
        };
        match kind {
            scan::Kind::Inclusive => out.push(next.clone()),
            scan::Kind::Exclusive => out.push(acc.clone().unwrap_or_default()),
        }
        acc = Some(next);
    }
    out
}

#[test]
fn scan_and_exscan_give_each_rank_its_prefix_in_rank_order() {
    let custom = Reduction::<i64>::custom(|acc, other| {
        for (a, b) in acc.iter_mut().zip(other) {
            *a = then(*a, *b);
        }
    });
    let mut rng = Rng(14);
    for p in SIZES {
        for (kind, algo) in [scan::Kind::Inclusive, scan::Kind::Exclusive]
            .into_iter()
            .flat_map(|k| {
                [
                    (k, scan::Algorithm::RecursiveDoubling),
                    (k, scan::Algorithm::Chain),
                ]
            })
        {
            for n in [0, 1, 5] {
                let plans: Vec<Plan> = (0..p).map(|r| scan::schedule(r, p, n, kind, algo)).collect();
                for op in Op::ALL.into_iter().map(Some).chain([None]) {
                    let inputs: Vec<Vec<i64>> = (0..p)
                        .map(|_| (0..n).map(|_| rng.next() as i64).collect())
                        .collect();
                    let (red, want) = match op {
                        Some(op) => (
                            Reduction::Op(op),
                            prefixes(&inputs, kind, |a, b| op_i64(op, a, b)),
                        ),
                        None => (custom.clone(), prefixes(&inputs, kind, then)),
                    };
                    let (scheds, works) = start(&plans, &inputs);
                    let got = results(&plans, run(&scheds, works, Some(&red)));
                    assert_eq!(got, want, "{kind:?} {algo:?} {op:?}, {p} ranks, n {n}");
                }
            }
        }
    }
}

/// The affine maps really do not commute, or the test above proves
/// nothing about the order.
#[test]
fn the_test_reduction_is_associative_but_not_commutative() {
    let mut rng = Rng(15);
    let mut differ = 0;
    for _ in 0..100 {
        let (x, y, z) = (rng.next() as i64, rng.next() as i64, rng.next() as i64);
        assert_eq!(then(then(x, y), z), then(x, then(y, z)));
        differ += usize::from(then(x, y) != then(y, x));
    }
    assert!(differ > 90, "{differ}");
}

/// Recursive doubling takes ⌈log2 size⌉ rounds at most; the chain is
/// chosen for long vectors only.
#[test]
fn scan_takes_logarithmic_rounds_and_the_chain_is_for_long_vectors() {
    for p in SIZES {
        let most = (0..p)
            .map(|r| {
                scan::schedule(r, p, 4, scan::Kind::Inclusive, scan::Algorithm::RecursiveDoubling)
                    .sched
                    .rounds
                    .len()
            })
            .max()
            .unwrap_or(0);
        assert_eq!(most, p.next_power_of_two().trailing_zeros() as usize, "{p} ranks");
    }
    assert_eq!(scan::choose(8, 8), scan::Algorithm::RecursiveDoubling);
    assert_eq!(
        scan::choose(scan::CHAIN_MIN_BYTES, 2),
        scan::Algorithm::RecursiveDoubling
    );
    assert_eq!(scan::choose(scan::CHAIN_MIN_BYTES, 3), scan::Algorithm::Chain);
}
