//! The node's collective slots protocol (`on_node.rs`) with threads
//! standing in for ranks, each rank's slots in a segment of its own.

use super::on_node::{fold_in_rank_order, Call, Kind, NodeColl};
use super::on_node_copy;
use crate::transport::event_loop::idle::Idler;
use crate::transport::event_loop::LoopConfig;
use crate::transport::node::segment::{Segment, HEADER};
use crate::transport::node::slots::{Slots, AREA, HEAD_WORDS};
use crate::world::collectives::ops::{bytes_of, Op, Reduction};
use std::sync::Arc;
use std::time::Duration;

/// `n` ranks' slots, each rank's in a segment of its own, as every
/// rank of a node maps them.
fn node(n: usize) -> Vec<Slots> {
    (0..n)
        .map(|_| Slots::new(Arc::new(Segment::create(HEADER + AREA).expect("segment")), HEADER))
        .collect()
}

fn rank(slots: &[Slots], me: u32) -> NodeColl {
    NodeColl::new(slots.to_vec(), me, true, Idler::new(&LoopConfig::default()))
}

/// One allreduce of `mine` by hand, as `World::run_on_node` runs it,
/// yielding where it would turn the World.
fn allreduce(nc: &mut NodeColl, mine: u64, slow: bool) -> Result<u64, String> {
    let k = nc.begin();
    while !nc.may_post(k) {
        std::thread::yield_now();
    }
    let sum = Reduction::Op(Op::Sum);
    let mut call = Call::new::<u64>(Kind::Allreduce, "allreduce", 1, 0).reducing(&sum);
    call.seq = k as u32;
    nc.post(k, &call, bytes_of(&[mine]), 0);
    let mut progress = false;
    loop {
        match nc.gather(k, &call, &mut progress) {
            Ok(true) => break,
            Ok(false) => std::thread::yield_now(),
            Err(d) => {
                nc.finish(k);
                return Err(format!("rank {}: {}", d.rank, d.message));
            }
        }
    }
    if slow {
        // Read late: the others are told to wait for room meanwhile.
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut data = [0u64];
    fold_in_rank_order(nc, k, &mut data, &sum, &mut Vec::new());
    nc.finish(k);
    Ok(data[0])
}

/// One broadcast of `value` from `root` by hand: the root posts and
/// goes, the others read the root's slot (slowly if `slow`).
fn broadcast(nc: &mut NodeColl, root: u32, value: u64, slow: bool) -> u64 {
    let k = nc.begin();
    while !nc.may_post(k) {
        std::thread::yield_now();
    }
    let mut call = Call::new::<u64>(Kind::Broadcast, "broadcast", 1, root);
    call.seq = k as u32;
    let me = nc.me();
    nc.post(
        k,
        &call,
        if me == root {
            bytes_of(std::slice::from_ref(&value))
        } else {
            &[]
        },
        0,
    );
    nc.only(if me == root { None } else { Some(root) });
    let mut progress = false;
    while !nc.gather(k, &call, &mut progress).expect("agreed") {
        std::thread::yield_now();
    }
    if slow {
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut got = [value];
    if me != root {
        got[0] = u64::from_ne_bytes(nc.data(k, root, 8).try_into().expect("8 bytes"));
    }
    nc.finish(k);
    got[0]
}

/// A root that posts and goes runs ahead of a slow reader by as many
/// collectives as there are slots, and no further: the reader still
/// reads each value the root posted, not a later one in the same slot.
#[test]
fn a_root_that_runs_ahead_never_overwrites_what_a_slow_rank_reads() {
    let slots = node(2);
    let rounds = 200u64;
    let threads: Vec<_> = (0..2u32)
        .map(|me| {
            let mut nc = rank(&slots, me);
            std::thread::spawn(move || {
                for k in 0..rounds {
                    let got = broadcast(&mut nc, 1, 100 + k, me == 0 && k % 3 == 0);
                    assert_eq!(got, 100 + k, "rank {me}, broadcast {k}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a rank");
    }
}

#[test]
fn ranks_far_apart_in_speed_get_every_sum_right() {
    let slots = node(3);
    let rounds = 300u64;
    let threads: Vec<_> = (0..3u32)
        .map(|me| {
            let mut nc = rank(&slots, me);
            std::thread::spawn(move || {
                for k in 0..rounds {
                    let mine = u64::from(me) * 1000 + k;
                    let got = allreduce(&mut nc, mine, me == 0 && k % 7 == 0).expect("agreed");
                    assert_eq!(got, 3000 + 3 * k, "rank {me}, collective {k}");
                }
                nc.begun()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().expect("a rank"), rounds);
    }
}

#[test]
fn a_rank_that_passes_another_length_fails_every_rank_naming_it() {
    let slots = node(2);
    let mut a = rank(&slots, 0);
    let mut b = rank(&slots, 1);
    let k = b.begin();
    let mut other =
        Call::new::<u64>(Kind::Allreduce, "allreduce", 2, 0).reducing(&Reduction::<u64>::Op(Op::Sum));
    other.seq = 0;
    b.post(k, &other, bytes_of(&[1u64, 2]), 0);
    let e = allreduce(&mut a, 5, false).expect_err("lengths differ");
    assert!(
        e.contains(
            "rank 1: rank 1 sent 16 bytes (2 × u64) to the allreduce, where this rank expected 8 (1 × u64)"
        ),
        "{e}"
    );
}

#[test]
fn a_refusal_reaches_the_others_with_its_reason() {
    let slots = node(2);
    let mut a = rank(&slots, 0);
    let mut b = rank(&slots, 1);
    let k = b.begin();
    let mut call = Call::new::<u64>(Kind::Allreduce, "allreduce", 1, 0);
    call.seq = 0;
    b.refuse(k, &call, "BitXor is a bitwise op");
    let e = allreduce(&mut a, 5, false).expect_err("refused");
    assert!(
        e.contains("rank 1 refused its allreduce: BitXor is a bitwise op"),
        "{e}"
    );
}

#[test]
fn a_stamp_outside_the_protocol_is_named_not_waited_for() {
    let slots = node(2);
    let mut a = rank(&slots, 0);
    // Rank 1's slot 0 stamped for collective 4, which cannot be there
    // before rank 0 has read collective 0.
    slots[1].post(4, [0; HEAD_WORDS], &[]);
    let e = allreduce(&mut a, 5, false).expect_err("corrupt");
    assert!(e.contains("rank 1's collective slot holds stamp"), "{e}");
}

/// One allreduce larger than a slot by hand, as `World::run_on_node` and
/// `run_single_copy` run it: header with the data's address, every
/// header, this rank's part, the phase, the others' parts, done, and the
/// wait for every rank's done.
fn allreduce_by_reads(nc: &mut NodeColl, data: &mut [f64]) -> Result<(), String> {
    let k = nc.begin();
    while !nc.may_post(k) {
        std::thread::yield_now();
    }
    let sum = Reduction::Op(Op::Sum);
    let mut call = Call::new::<f64>(Kind::Allreduce, "allreduce", data.len(), 0).reducing(&sum);
    call.seq = k as u32;
    nc.post(k, &call, &[], data.as_ptr() as u64);
    let mut progress = false;
    let out = (|| {
        while !nc.gather(k, &call, &mut progress).map_err(|d| d.message)? {
            std::thread::yield_now();
        }
        assert!(nc.single_copy(k), "threads of one process may read each other");
        on_node_copy::fold_own_part(nc, k, data, &sum).map_err(|d| d.message)?;
        nc.phase_done(k);
        while !nc.phases(k).map_err(|d| d.message)? {
            std::thread::yield_now();
        }
        on_node_copy::read_other_parts(nc, k, data).map_err(|d| d.message)
    })();
    nc.finish(k);
    while !nc.all_done(k) {
        std::thread::yield_now();
    }
    out
}

/// Every rank of a large allreduce gets the same bits, those of the sum
/// taken in rank order, over rounds in which a slow rank lets the others
/// run ahead to the next call.
#[test]
fn a_large_allreduce_by_reads_gives_every_rank_the_rank_order_sum() {
    let n = 3;
    let len = 25_001; // parts of 8333 and 8334 elements, several pieces each
    let slots = node(n);
    let value =
        |rank: usize, round: usize, i: usize| ((rank * 7 + round) as f64).powi(3) / (i + 1) as f64 + 0.1;
    let threads: Vec<_> = (0..n as u32)
        .map(|me| {
            let mut nc = rank(&slots, me);
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for round in 0..20 {
                    let mut data: Vec<f64> = (0..len).map(|i| value(me as usize, round, i)).collect();
                    if me == 1 && round % 4 == 0 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    allreduce_by_reads(&mut nc, &mut data).expect("agreed");
                    got.push(data);
                }
                got
            })
        })
        .collect();
    let got: Vec<Vec<Vec<f64>>> = threads.into_iter().map(|t| t.join().expect("a rank")).collect();
    for round in 0..20 {
        let expect: Vec<f64> = (0..len)
            .map(|i| (1..n).fold(value(0, round, i), |acc, r| acc + value(r, round, i)))
            .collect();
        for (r, g) in got.iter().enumerate() {
            let same = g[round]
                .iter()
                .zip(&expect)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "rank {r}, round {round}: not the rank-order sum's bits");
        }
    }
}

/// A rank whose data address cannot be read (a forged header, or a
/// process gone) fails the reader's call with the errno, naming it; the
/// reader does not crash or wait for ever.
#[test]
fn an_unreadable_address_fails_the_reader_naming_the_rank() {
    let slots = node(2);
    let mut a = rank(&slots, 0);
    let mut b = rank(&slots, 1);
    let len = 4096;
    let k = b.begin();
    let sum = Reduction::<f64>::Op(Op::Sum);
    let mut call = Call::new::<f64>(Kind::Allreduce, "allreduce", len, 0).reducing(&sum);
    call.seq = 0;
    // Rank 1 says its data is at address 8, where nothing is mapped.
    b.post(k, &call, &[], 8);
    let t = std::thread::spawn(move || {
        // Rank 1 takes no part: it says it is done once rank 0 is.
        while !b.all_done(k) {
            std::thread::yield_now();
        }
        b.finish(k);
    });
    let mut data = vec![1.0f64; len];
    let e = allreduce_by_reads(&mut a, &mut data).expect_err("unreadable");
    assert!(
        e.contains("reading") && e.contains("rank 1's data") && e.contains("Bad address"),
        "{e}"
    );
    t.join().expect("rank 1");
}
