//! The node's collective slots protocol (`on_node.rs`) with threads
//! standing in for ranks, each rank's slots in a segment of its own.

use super::on_node::{fold_in_rank_order, Call, Kind, NodeColl};
use crate::transport::event_loop::idle::Idler;
use crate::transport::event_loop::LoopConfig;
use crate::transport::node::segment::{Segment, HEADER};
use crate::transport::node::slots::{Slots, AREA};
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
    nc.post(k, &call, bytes_of(&[mine]));
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
    b.post(k, &other, bytes_of(&[1u64, 2]));
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
    slots[1].post(4, [0; 4], &[]);
    let e = allreduce(&mut a, 5, false).expect_err("corrupt");
    assert!(e.contains("rank 1's collective slot holds stamp"), "{e}");
}
