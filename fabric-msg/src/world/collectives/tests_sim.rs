//! Every algorithm's schedules for every rank of worlds of 1 to 17 (and 32,
//! 33) ranks, run in memory against a sequential reference: each message
//! must be received exactly once, by the rank and step it was meant for,
//! with the length the receiver expects; no rank may wait for ever. The
//! fabric tests (`examples/tests/collectives.rs`) run the same collectives
//! between processes.

use super::ops::{to_bytes, Element, Op, Reduction};
use super::request::{extract, Shape};
use super::schedule::{Apply, Schedule};
use super::{allgather, allreduce, barrier, bcast, gather, reduce, reduce_scatter};
use std::collections::{HashMap, HashSet};

pub(super) const SIZES: [u32; 19] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 32, 33];

/// A small deterministic generator (xorshift64*).
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Run every rank's schedule; ranks in `hold` never start. Returns each
/// rank's working array and whether it finished, or what went wrong.
pub(super) fn simulate<T: Element>(
    scheds: &[Schedule],
    mut works: Vec<Vec<T>>,
    red: Option<&Reduction<T>>,
    hold: &[usize],
) -> Result<(Vec<Vec<T>>, Vec<bool>), String> {
    let p = scheds.len();
    let (mut round, mut sent) = (vec![0usize; p], vec![false; p]);
    let mut mail: HashMap<(u32, u32, u32), Vec<u8>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut scratch = Vec::new();
    // What sending from, and receiving straight into, the working array
    // relies on: within a round no block is both sent and copied into, and
    // a block copied into is touched by no other receive.
    let overlap = |a: &super::schedule::Xfer, b: &super::schedule::Xfer| {
        a.len > 0 && b.len > 0 && a.at < b.at + b.len && b.at < a.at + a.len
    };
    for (r, sched) in scheds.iter().enumerate() {
        for (k, rd) in sched.rounds.iter().enumerate() {
            for (i, x) in rd.recvs.iter().enumerate() {
                let copied = |y: &super::schedule::Xfer| x.apply == Apply::Copy || y.apply == Apply::Copy;
                if rd.recvs[..i].iter().any(|y| copied(y) && overlap(x, y)) {
                    return Err(format!(
                        "rank {r} round {k}: a block copied into overlaps another receive"
                    ));
                }
                if x.apply == Apply::Copy && rd.sends.iter().any(|y| overlap(x, y)) {
                    return Err(format!("rank {r} round {k}: a block is sent and received into"));
                }
            }
        }
    }
    loop {
        let mut moved = false;
        for r in (0..p).filter(|r| !hold.contains(r)) {
            while let Some(rd) = scheds[r].rounds.get(round[r]) {
                if !sent[r] {
                    for x in &rd.sends {
                        let key = (r as u32, x.peer, x.step);
                        if !seen.insert(key) {
                            return Err(format!("rank {r} sends to {} at step {} twice", x.peer, x.step));
                        }
                        mail.insert(key, to_bytes(&works[r][x.at..x.at + x.len]));
                    }
                    sent[r] = true;
                    moved = true;
                }
                if !rd
                    .recvs
                    .iter()
                    .all(|x| mail.contains_key(&(x.peer, r as u32, x.step)))
                {
                    break;
                }
                for x in &rd.recvs {
                    let m = mail.remove(&(x.peer, r as u32, x.step)).unwrap_or_default();
                    if m.len() != x.len * T::SIZE {
                        return Err(format!(
                            "rank {r} expects {} bytes from {} at step {}, gets {}",
                            x.len * T::SIZE,
                            x.peer,
                            x.step,
                            m.len()
                        ));
                    }
                    let region = &mut works[r][x.at..x.at + x.len];
                    match (x.apply, red) {
                        (Apply::Copy, _) | (_, None) => T::read(&m, region),
                        (a, Some(red)) => {
                            red.combine_bytes(region, &m, a == Apply::CombineOtherFirst, &mut scratch)
                        }
                    }
                }
                round[r] += 1;
                sent[r] = false;
                moved = true;
            }
        }
        let done: Vec<bool> = (0..p).map(|r| round[r] == scheds[r].rounds.len()).collect();
        if done.iter().all(|d| *d) || !moved {
            if hold.is_empty() && !done.iter().all(|d| *d) {
                return Err(format!("deadlock: ranks stuck at rounds {round:?}"));
            }
            if hold.is_empty() && !mail.is_empty() {
                return Err(format!("messages never received: {:?}", mail.keys()));
            }
            return Ok((works, done));
        }
    }
}

pub(super) fn run<T: Element>(
    scheds: &[Schedule],
    works: Vec<Vec<T>>,
    red: Option<&Reduction<T>>,
) -> Vec<Vec<T>> {
    simulate(scheds, works, red, &[])
        .unwrap_or_else(|e| panic!("{} ranks: {e}", scheds.len()))
        .0
}

pub(super) fn values(rng: &mut Rng, n: usize) -> Vec<i64> {
    (0..n).map(|_| rng.below(2001) as i64 - 1000).collect()
}

pub(super) fn counts(rng: &mut Rng, p: u32) -> Vec<usize> {
    (0..p)
        .map(|_| {
            if rng.below(4) == 0 {
                0
            } else {
                rng.below(9) as usize
            }
        })
        .collect()
}

/// Element `i` of `a ⊕ b` for the built-in op on i64.
pub(super) fn op_i64(op: Op, a: i64, b: i64) -> i64 {
    match op {
        Op::Sum => a.wrapping_add(b),
        Op::Prod => a.wrapping_mul(b),
        Op::Min => a.min(b),
        Op::Max => a.max(b),
        Op::BitAnd => a & b,
        Op::BitOr => a | b,
        Op::BitXor => a ^ b,
    }
}

fn reference(op: Op, inputs: &[Vec<i64>]) -> Vec<i64> {
    let mut acc = inputs[0].clone();
    for v in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(v) {
            *a = op_i64(op, *a, *b);
        }
    }
    acc
}

#[test]
fn barrier_lets_nobody_through_until_everyone_arrives() {
    for p in SIZES {
        for algo in [barrier::Algorithm::Linear, barrier::Algorithm::Dissemination] {
            let scheds: Vec<Schedule> = (0..p).map(|r| barrier::schedule(r, p, algo)).collect();
            run::<u8>(&scheds, vec![vec![]; p as usize], None);
            if p > 1 {
                for late in [0, p as usize / 2, p as usize - 1] {
                    let (_, done) = simulate::<u8>(&scheds, vec![vec![]; p as usize], None, &[late]).unwrap();
                    assert!(
                        done.iter().all(|d| !d),
                        "{p} ranks, {algo:?}, rank {late} absent: {done:?} got through"
                    );
                }
            }
        }
    }
    assert_eq!(barrier::choose(2), barrier::Algorithm::Dissemination);
    assert_eq!(barrier::choose(3), barrier::Algorithm::Linear);
    assert_eq!(
        barrier::choose(barrier::LINEAR_MAX_RANKS),
        barrier::Algorithm::Linear
    );
    assert_eq!(
        barrier::choose(barrier::LINEAR_MAX_RANKS + 1),
        barrier::Algorithm::Dissemination
    );
}

#[test]
fn broadcast_gives_every_rank_the_roots_data() {
    let mut rng = Rng(1);
    for p in SIZES {
        for algo in [
            bcast::Algorithm::Linear,
            bcast::Algorithm::Binomial,
            bcast::Algorithm::ScatterAllgather,
        ] {
            for n in [0, 1, 3, p as usize, 2 * p as usize + 1, 100] {
                let root = rng.below(u64::from(p)) as u32;
                let data = values(&mut rng, n);
                let scheds: Vec<Schedule> = (0..p).map(|r| bcast::schedule(r, p, root, n, algo)).collect();
                let works = (0..p)
                    .map(|r| if r == root { data.clone() } else { vec![0; n] })
                    .collect();
                for (r, w) in run(&scheds, works, None).iter().enumerate() {
                    assert_eq!(w, &data, "{algo:?}, {p} ranks, root {root}, n {n}, rank {r}");
                }
            }
        }
    }
}

#[test]
fn gatherv_collects_uneven_blocks_in_rank_order_on_the_root() {
    let mut rng = Rng(2);
    for p in SIZES {
        for algo in [gather::Algorithm::Binomial, gather::Algorithm::Linear] {
            for _ in 0..3 {
                let root = rng.below(u64::from(p)) as u32;
                let c = counts(&mut rng, p);
                let inputs: Vec<Vec<i64>> = c.iter().map(|&n| values(&mut rng, n)).collect();
                let plans: Vec<_> = (0..p).map(|r| gather::schedule(r, p, root, &c, algo)).collect();
                let scheds: Vec<Schedule> = plans.iter().map(|x| x.0.clone()).collect();
                let works = (0..p as usize)
                    .map(|r| {
                        let mut w = vec![0; plans[r].1];
                        let at = if algo == gather::Algorithm::Linear && r == root as usize {
                            c[..r].iter().sum()
                        } else {
                            0
                        };
                        w[at..at + c[r]].copy_from_slice(&inputs[r]);
                        w
                    })
                    .collect();
                let outs = run(&scheds, works, None);
                let want: Vec<i64> = inputs.concat();
                for r in 0..p as usize {
                    let got = extract(outs[r].clone(), &plans[r].2);
                    let expect = if r == root as usize { want.clone() } else { vec![] };
                    assert_eq!(
                        got, expect,
                        "{algo:?}, {p} ranks, root {root}, counts {c:?}, rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn allgatherv_gives_every_rank_every_block_in_rank_order() {
    let mut rng = Rng(3);
    for p in SIZES {
        for algo in [allgather::Algorithm::Bruck, allgather::Algorithm::Ring] {
            for _ in 0..3 {
                let c = counts(&mut rng, p);
                let inputs: Vec<Vec<i64>> = c.iter().map(|&n| values(&mut rng, n)).collect();
                let total: usize = c.iter().sum();
                let plans: Vec<_> = (0..p).map(|r| allgather::schedule(r, p, &c, algo)).collect();
                let scheds: Vec<Schedule> = plans.iter().map(|x| x.0.clone()).collect();
                let works = (0..p as usize)
                    .map(|r| {
                        let mut w = vec![0; total];
                        w[plans[r].1..plans[r].1 + c[r]].copy_from_slice(&inputs[r]);
                        w
                    })
                    .collect();
                let outs = run(&scheds, works, None);
                for r in 0..p as usize {
                    let got = extract(outs[r].clone(), &plans[r].2);
                    assert_eq!(
                        got,
                        inputs.concat(),
                        "{algo:?}, {p} ranks, counts {c:?}, rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn reduce_combines_every_ranks_vector_on_the_root() {
    let mut rng = Rng(4);
    for p in SIZES {
        for algo in [reduce::Algorithm::Binomial, reduce::Algorithm::ScatterGather] {
            for op in Op::ALL {
                let (root, n) = (rng.below(u64::from(p)) as u32, rng.below(40) as usize);
                let inputs: Vec<Vec<i64>> = (0..p).map(|_| values(&mut rng, n)).collect();
                let scheds: Vec<Schedule> = (0..p).map(|r| reduce::schedule(r, p, root, n, algo)).collect();
                let outs = run(&scheds, inputs.clone(), Some(&Reduction::Op(op)));
                assert_eq!(
                    outs[root as usize],
                    reference(op, &inputs),
                    "{algo:?} {op:?}, {p} ranks, root {root}, n {n}"
                );
            }
        }
    }
}

#[test]
fn allreduce_gives_every_rank_the_same_combination() {
    let mut rng = Rng(5);
    for p in SIZES {
        for algo in [
            allreduce::Algorithm::RecursiveDoubling,
            allreduce::Algorithm::Ring,
        ] {
            for op in Op::ALL {
                for n in [0, 1, p as usize - 1, p as usize + 3, 37] {
                    let inputs: Vec<Vec<i64>> = (0..p).map(|_| values(&mut rng, n)).collect();
                    let scheds: Vec<Schedule> = (0..p).map(|r| allreduce::schedule(r, p, n, algo)).collect();
                    let want = reference(op, &inputs);
                    for (r, got) in run(&scheds, inputs, Some(&Reduction::Op(op))).iter().enumerate() {
                        assert_eq!(got, &want, "{algo:?} {op:?}, {p} ranks, n {n}, rank {r}");
                    }
                }
            }
        }
    }
}

/// Float sums depend on the order; every rank must still hold the same
/// bits, and the value must be the sum to rounding.
#[test]
fn float_allreduce_is_bit_identical_on_every_rank() {
    let mut rng = Rng(6);
    for p in SIZES {
        for algo in [
            allreduce::Algorithm::RecursiveDoubling,
            allreduce::Algorithm::Ring,
        ] {
            let n = 2 * p as usize + 5;
            let inputs: Vec<Vec<f64>> = (0..p)
                .map(|_| {
                    (0..n)
                        .map(|_| rng.next() as f64 / u64::MAX as f64 - 0.3)
                        .collect()
                })
                .collect();
            let scheds: Vec<Schedule> = (0..p).map(|r| allreduce::schedule(r, p, n, algo)).collect();
            let outs = run(&scheds, inputs.clone(), Some(&Reduction::Op(Op::Sum)));
            for i in 0..n {
                let exact: f64 = inputs.iter().map(|v| v[i]).sum();
                assert!((outs[0][i] - exact).abs() < 1e-12, "{algo:?}, {p} ranks");
                for o in &outs {
                    assert_eq!(
                        o[i].to_bits(),
                        outs[0][i].to_bits(),
                        "{algo:?}, {p} ranks, element {i}"
                    );
                }
            }
        }
    }
}

/// `min(-0, +0)` may give either zero: partners must combine in the same
/// order, or ranks end with different bits.
#[test]
fn signed_zeros_come_out_the_same_on_every_rank() {
    let mut rng = Rng(9);
    for p in SIZES {
        for op in [Op::Min, Op::Max] {
            let inputs: Vec<Vec<f64>> = (0..p)
                .map(|_| {
                    (0..8)
                        .map(|_| if rng.below(2) == 0 { 0.0 } else { -0.0 })
                        .collect()
                })
                .collect();
            let scheds: Vec<Schedule> = (0..p)
                .map(|r| allreduce::schedule(r, p, 8, allreduce::Algorithm::RecursiveDoubling))
                .collect();
            let outs = run(&scheds, inputs, Some(&Reduction::Op(op)));
            for o in &outs {
                let bits = |v: &Vec<f64>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(o), bits(&outs[0]), "{op:?}, {p} ranks");
            }
        }
    }
}

#[test]
fn custom_reductions_reach_every_rank() {
    // Keeps, per element, the value with the larger absolute value.
    let red = Reduction::<i64>::custom(|acc, other| {
        for (a, b) in acc.iter_mut().zip(other) {
            if b.abs() > a.abs() || (b.abs() == a.abs() && *b > *a) {
                *a = *b;
            }
        }
    });
    let mut rng = Rng(7);
    for p in SIZES {
        let n = 9;
        let inputs: Vec<Vec<i64>> = (0..p).map(|_| values(&mut rng, n)).collect();
        let want: Vec<i64> = (0..n)
            .map(|i| {
                inputs
                    .iter()
                    .map(|v| v[i])
                    .max_by_key(|x| (x.abs(), *x))
                    .unwrap_or(0)
            })
            .collect();
        for algo in [
            allreduce::Algorithm::RecursiveDoubling,
            allreduce::Algorithm::Ring,
        ] {
            let scheds: Vec<Schedule> = (0..p).map(|r| allreduce::schedule(r, p, n, algo)).collect();
            for got in run(&scheds, inputs.clone(), Some(&red)) {
                assert_eq!(got, want, "{algo:?}, {p} ranks");
            }
        }
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_combined_block() {
    let mut rng = Rng(8);
    for p in SIZES {
        for op in [Op::Sum, Op::Min, Op::BitXor] {
            let c = counts(&mut rng, p);
            let total: usize = c.iter().sum();
            let inputs: Vec<Vec<i64>> = (0..p).map(|_| values(&mut rng, total)).collect();
            let scheds: Vec<Schedule> = (0..p).map(|r| reduce_scatter::schedule(r, p, &c)).collect();
            let outs = run(&scheds, inputs.clone(), Some(&Reduction::Op(op)));
            let want = reference(op, &inputs);
            for r in 0..p as usize {
                let at: usize = c[..r].iter().sum();
                let got = extract(outs[r].clone(), &Shape::Pieces(vec![(at, c[r])]));
                assert_eq!(
                    got,
                    want[at..at + c[r]],
                    "{op:?}, {p} ranks, counts {c:?}, rank {r}"
                );
            }
        }
    }
}

/// A rank that passes a longer vector than the others is caught by the
/// length check of whoever receives from it, with every algorithm.
#[test]
fn a_longer_vector_on_one_rank_is_seen_as_a_length_mismatch() {
    for p in [2u32, 3, 5, 8] {
        for algo in [
            allreduce::Algorithm::RecursiveDoubling,
            allreduce::Algorithm::Ring,
        ] {
            let mut scheds: Vec<Schedule> = (0..p).map(|r| allreduce::schedule(r, p, 16, algo)).collect();
            scheds[1] = allreduce::schedule(1, p, 17, algo);
            let works = (0..p).map(|r| vec![1i64; if r == 1 { 17 } else { 16 }]).collect();
            let e = simulate(&scheds, works, Some(&Reduction::Op(Op::Sum)), &[]).unwrap_err();
            assert!(e.contains("expects"), "{algo:?}, {p} ranks: {e}");
        }
    }
}
