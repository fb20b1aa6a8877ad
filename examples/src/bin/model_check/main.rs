//! The SPMD programming model, checked between real processes on any
//! number of ranks: communicators (split by parity, by node, dup),
//! collectives on each against a sequential reference (and their
//! persistent forms, and reductions of the application's structs), typed and serde
//! point-to-point messages with requests, probe and matched probe,
//! `wait_any` over a mixed set, a receive too small for its message, and
//! the limit on live communicators. Every value is checked; each rank prints its count.
//!
//! ```text
//! mpirun -np 5 model_check
//! srun --mpi=pmix -n 3 model_check
//! ```

mod plans_and_records;

use fabric_msg::{Access, Atomic, Comm, Error, Op, World};
use fabric_msg_examples::tally::Tally;
use serde::{Deserialize, Serialize};
use std::process::ExitCode;

/// A value only serde can carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Report {
    from: u32,
    name: String,
    squares: Vec<u64>,
    ratio: Option<f64>,
}

/// A struct of the application's, reduced by its own function.
#[derive(Debug, Clone, Copy, PartialEq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct MinLoc {
    value: f64,
    rank: u32,
    slot: u32,
}

impl MinLoc {
    /// The smaller value; of equal ones, the lower rank's.
    fn min(self, other: MinLoc) -> MinLoc {
        if (other.value, other.rank) < (self.value, self.rank) {
            other
        } else {
            self
        }
    }
}

/// Rank `w`'s `i`th input element.
fn input(w: u32, i: usize) -> i64 {
    (w as i64 + 1) * 1000 + i as i64 * 7 - 3
}

/// Every collective on `comm` against a reference computed from the
/// members' world ranks.
fn collectives(world: &mut World, comm: &Comm, name: &str, t: &mut Tally) -> fabric_msg::Result<()> {
    let members = comm.members().to_vec();
    let (r, n) = (comm.rank(), comm.size());
    let me = members[r as usize];
    let len = 5;
    let mine: Vec<i64> = (0..len).map(|i| input(me, i)).collect();
    let all: Vec<Vec<i64>> = members
        .iter()
        .map(|&w| (0..len).map(|i| input(w, i)).collect())
        .collect();
    let sum: Vec<i64> = (0..len).map(|i| all.iter().map(|v| v[i]).sum()).collect();
    let mut v = mine.clone();
    world.on(comm).allreduce(&mut v, Op::Sum)?;
    t.expect(&format!("{name}: allreduce sum"), &v, &sum);
    let mut v = mine.clone();
    world.on(comm).allreduce(&mut v, Op::Max)?;
    let max: Vec<i64> = (0..len)
        .map(|i| all.iter().map(|v| v[i]).max().unwrap_or(0))
        .collect();
    t.expect(&format!("{name}: allreduce max"), v, max);
    let root = n - 1;
    let mut v = if r == root { mine.clone() } else { vec![0; len] };
    world.on(comm).broadcast(root, &mut v)?;
    t.expect(&format!("{name}: broadcast from {root}"), &v, &all[root as usize]);
    let got = world.on(comm).allgather(&mine)?;
    t.expect(&format!("{name}: allgather"), got, all.concat());
    let got = world.on(comm).gather(0, &mine)?;
    t.expect(
        &format!("{name}: gather to 0"),
        got,
        if r == 0 { all.concat() } else { vec![] },
    );
    let counts: Vec<usize> = (0..n as usize).map(|k| k % 3).collect();
    let part: Vec<i64> = mine[..counts[r as usize]].to_vec();
    let want: Vec<i64> = all
        .iter()
        .zip(&counts)
        .flat_map(|(v, &c)| v[..c].to_vec())
        .collect();
    let got = world.on(comm).allgatherv(&part, &counts)?;
    t.expect(&format!("{name}: allgatherv {counts:?}"), got, want);
    let mut v = mine.clone();
    world.on(comm).reduce(0, &mut v, Op::Sum)?;
    if r == 0 {
        t.expect(&format!("{name}: reduce to 0"), &v, &sum);
    }
    let blocks: Vec<usize> = (0..n as usize).map(|k| 1 + k % 2).collect();
    let total: usize = blocks.iter().sum();
    let wide = |w: u32| -> Vec<i64> { (0..total).map(|i| input(w, i)).collect() };
    let at: usize = blocks[..r as usize].iter().sum();
    let want: Vec<i64> = (at..at + blocks[r as usize])
        .map(|i| members.iter().map(|&w| wide(w)[i]).sum())
        .collect();
    let got = world.on(comm).reduce_scatter(&wide(me), &blocks, Op::Sum)?;
    t.expect(&format!("{name}: reduce_scatter {blocks:?}"), got, want);
    // The rest of the set, on the communicator too.
    let got = world
        .on(comm)
        .scatter(0, &if r == 0 { all.concat() } else { vec![] }, len)?;
    t.expect(&format!("{name}: scatter from 0"), &got, &all[r as usize]);
    let pairs: Vec<i64> = (0..n).map(|k| i64::from(me) * 100 + i64::from(k)).collect();
    let want: Vec<i64> = members
        .iter()
        .map(|&w| i64::from(w) * 100 + i64::from(r))
        .collect();
    t.expect(
        &format!("{name}: alltoall"),
        world.on(comm).alltoall(&pairs)?,
        want,
    );
    let mut v = mine.clone();
    world.on(comm).scan(&mut v, Op::Sum)?;
    let prefix: Vec<i64> = (0..len)
        .map(|i| all[..=r as usize].iter().map(|v| v[i]).sum())
        .collect();
    t.expect(&format!("{name}: scan"), v, prefix);
    let ex = world.on(comm).exscan(&mine, Op::Sum)?;
    let before: Vec<i64> = (0..len)
        .map(|i| all[..r as usize].iter().map(|v| v[i]).sum())
        .collect();
    t.expect(&format!("{name}: exscan"), ex, (r > 0).then_some(before));
    // Persistent: planned once, started three times, beside a broadcast
    // and a barrier planned the same way.
    let sum_plan = world.on(comm).allreduce_init::<i64>(len, Op::Sum)?;
    let bcast_plan = world.on(comm).broadcast_init::<i64>(0, len)?;
    let barrier_plan = world.on(comm).barrier_init()?;
    for k in 0..3i64 {
        let v: Vec<i64> = mine.iter().map(|x| x * k).collect();
        let req = world.start(&sum_plan, v)?;
        let want: Vec<i64> = sum.iter().map(|x| x * k).collect();
        t.expect(
            &format!("{name}: persistent allreduce #{k}"),
            world.wait(req)?,
            want,
        );
        let req = world.start(&bcast_plan, if r == 0 { vec![k; len] } else { vec![0; len] })?;
        t.expect(
            &format!("{name}: persistent broadcast #{k}"),
            world.wait(req)?,
            vec![k; len],
        );
        let req = world.start(&barrier_plan, Vec::new())?;
        world.wait(req)?;
    }
    match world.start(&sum_plan, vec![1i64; len + 1]) {
        Err(Error::Usage(m)) => t.expect(
            &format!("{name}: a start of the wrong length says so"),
            m.contains("planned for"),
            true,
        ),
        other => t.failed.push(format!(
            "{name}: a persistent start of the wrong length: {other:?}"
        )),
    }
    // The application's own struct, combined by its own function: the
    // smallest value of each slot with the lowest rank that has it.
    let loc = |w: u32, i: usize| MinLoc {
        value: ((input(w, i) * 37) % 11) as f64,
        rank: w,
        slot: i as u32,
    };
    let mut v: Vec<MinLoc> = (0..len).map(|i| loc(me, i)).collect();
    let want: Vec<MinLoc> = (0..len)
        .map(|i| {
            members
                .iter()
                .map(|&w| loc(w, i))
                .fold(loc(members[0], i), |a, b| a.min(b))
        })
        .collect();
    world
        .on(comm)
        .allreduce_with(&mut v, |a: &mut MinLoc, b: &MinLoc| *a = a.min(*b))?;
    t.expect(&format!("{name}: allreduce_with MinLoc"), &v, &want);
    let mut v: Vec<MinLoc> = (0..len).map(|i| loc(me, i)).collect();
    world
        .on(comm)
        .reduce_with(n - 1, &mut v, |a: &mut MinLoc, b: &MinLoc| *a = a.min(*b))?;
    if r == n - 1 {
        t.expect(&format!("{name}: reduce_with MinLoc"), &v, &want);
    }
    world.on(comm).barrier()?;
    Ok(())
}

/// A ring over `comm` with typed non-blocking messages, both ways.
fn ring(world: &mut World, comm: &Comm, name: &str, t: &mut Tally) -> fabric_msg::Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let (left, right) = ((r + n - 1) % n, (r + 1) % n);
    let me = comm.members()[r as usize];
    let edge: Vec<f64> = (0..100).map(|i| me as f64 + i as f64 / 8.0).collect();
    let mut view = world.on(comm);
    let reqs = vec![
        view.irecv(Some(left), Some(1), vec![0.0f64; 100])?,
        view.irecv(Some(right), Some(2), Vec::with_capacity(100))?,
        view.isend(right, 1, &edge)?,
        view.isend(left, 2, &edge)?,
    ];
    let done = world.wait_all(reqs)?;
    let from = |k: u32| -> Vec<f64> {
        let w = comm.members()[k as usize];
        (0..100).map(|i| w as f64 + i as f64 / 8.0).collect()
    };
    t.expect(&format!("{name}: ring from the left"), &done[0], &from(left));
    t.expect(&format!("{name}: ring from the right"), &done[1], &from(right));
    t.expect(&format!("{name}: a send's result is empty"), done[2].len(), 0);
    Ok(())
}

/// Every rank of `comm` sends its rank to rank 0, which takes them with
/// `wait_any` over any-source receives and an allreduce in flight. The
/// receives are posted before the messages are sent (the barrier).
fn gather_any(world: &mut World, comm: &Comm, name: &str, t: &mut Tally) -> fabric_msg::Result<()> {
    let (r, n) = (comm.rank(), comm.size());
    let mut reqs: Vec<Option<fabric_msg::Request<u32>>> = Vec::new();
    reqs.push(Some(world.on(comm).iallreduce(vec![r], Op::Sum)?));
    if r == 0 {
        for _ in 1..n {
            reqs.push(Some(world.on(comm).irecv(None, Some(9), vec![0u32; 1])?));
        }
    }
    world.on(comm).barrier()?;
    if r != 0 {
        world.on(comm).send(0, 9, &[r * 10])?;
    }
    let mut sources = Vec::new();
    let mut sum = None;
    while let Some((i, v, status)) = world.wait_any(&mut reqs)? {
        trace(
            world.rank(),
            &format!("{name}: request {i} done: {v:?} {status:?}"),
        );
        if i == 0 {
            sum = Some(v);
        } else {
            t.expect(
                &format!("{name}: any-source value"),
                v.clone(),
                vec![status.source * 10],
            );
            sources.push(status.source);
        }
    }
    sources.sort_unstable();
    t.expect(
        &format!("{name}: any-source senders"),
        sources,
        if r == 0 { (1..n).collect() } else { vec![] },
    );
    t.expect(
        &format!("{name}: allreduce beside them"),
        sum,
        Some(vec![n * (n - 1) / 2]),
    );
    Ok(())
}

fn run(world: &mut World, t: &mut Tally) -> fabric_msg::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    // libfabric's shm before 1.19 matches a receive against earlier
    // messages with a stale ignore mask once masked (any-source) receives
    // have been posted: a later receive can miss its message or take
    // another's (the World then fails it: `Misdelivered`). A World whose
    // messages go over such an shm (`FABRIC_MSG_SHM=libfabric` on one
    // node) has no exact-receive pairing for any-source receives
    // (docs/world.md, "Known gap"): skip them there, loudly.
    let any_source = match world.any_source_defect() {
        Some(why) => {
            eprintln!("model_check: rank {rank}: SKIPPED any-source receives on this all-shm World: {why}");
            false
        }
        None => true,
    };
    // Communicators: parity, node, dup.
    let half = world
        .split(Some(rank % 2), i64::from(rank))?
        .expect("a colour was given");
    let parity: Vec<u32> = (0..size).filter(|w| w % 2 == rank % 2).collect();
    t.expect("parity members", half.members().to_vec(), parity);
    t.expect("parity rank", half.rank(), rank / 2);
    let node = world.split_shared()?;
    t.expect(
        "node members",
        node.members().to_vec(),
        world.node_ranks().to_vec(),
    );
    if std::env::var_os("FABRIC_MSG_NODE").is_none() {
        t.expect(
            "a node is the launcher's host",
            world.node_ranks().to_vec(),
            world.local_ranks().to_vec(),
        );
    }
    let reversed = world.split(Some(0), -i64::from(rank))?.expect("one colour");
    t.expect("split ordered by key", reversed.rank(), size - 1 - rank);
    t.expect(
        "translate",
        half.translate(half.rank(), &reversed),
        Some(size - 1 - rank),
    );
    let none = world.split(if rank == 0 { None } else { Some(1) }, 0)?;
    t.expect("no colour, no communicator", none.is_none(), rank == 0);
    let dup = world.dup()?;
    pretend_node(world, t)?;
    for (comm, name) in [
        (&half, "parity"),
        (&node, "node"),
        (&reversed, "reversed"),
        (&dup, "dup"),
    ] {
        trace(rank, name);
        let before = world.stats().node_collectives;
        collectives(world, comm, name, t)?;
        if name == "node" {
            // The node's communicator (its pretend node's ranks, where
            // FABRIC_MSG_NODE is set) runs its blocking collectives in
            // the node transport's slots.
            let node_transport = world.shm_report().contains("fabric-msg's node transport");
            t.expect(
                "the node communicator's collectives in its slots",
                world.stats().node_collectives > before,
                node_transport && comm.size() > 1,
            );
        }
        trace(rank, "persistent");
        plans_and_records::persistent(world, comm, name, t)?;
        trace(rank, "records");
        plans_and_records::records(world, comm, name, t)?;
        trace(rank, "ring");
        ring(world, comm, name, t)?;
        trace(rank, "any");
        if any_source {
            gather_any(world, comm, name, t)?;
        }
    }
    collectives_on_world(world, t)?;
    // A dup's messages never match the World's, even with the same tag.
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    world.isend(next, 5, &[1u8]).map(drop)?;
    world.on(&dup).send(next, 5, &[2u8])?;
    let mut got = [0u8];
    world.on(&dup).recv(Some(prev), Some(5), &mut got)?;
    t.expect("dup keeps its messages apart", got, [2]);
    world.recv(Some(prev), Some(5), &mut got)?;
    t.expect("the World's message waited for it", got, [1]);
    // Serde values.
    if rank == 0 {
        for to in 1..size {
            let r = Report {
                from: 0,
                name: format!("for {to}"),
                squares: (0..to as u64).map(|k| k * k).collect(),
                ratio: (to % 2 == 0).then_some(f64::from(to) / 3.0),
            };
            world.send_value(to, 7, &r)?;
        }
    } else {
        let (r, status): (Report, _) = world.recv_value(Some(0), Some(7))?;
        let want = Report {
            from: 0,
            name: format!("for {rank}"),
            squares: (0..rank as u64).map(|k| k * k).collect(),
            ratio: (rank % 2 == 0).then_some(f64::from(rank) / 3.0),
        };
        t.expect("serde value", r, want);
        t.expect("serde value's sender", status.source, 0);
    }
    // A message larger than its receive: a clear error, and the next one
    // still arrives.
    world.send(next, 11, &[7u32; 10])?;
    world.send(next, 12, &[8u32; 3])?;
    let mut small = [0u32; 4];
    match world.recv(Some(prev), Some(11), &mut small) {
        Err(Error::Truncated { len, capacity, .. }) => {
            t.expect("truncation says both sizes", (len, capacity), (Some(40), 16));
        }
        other => t.failed.push(format!("a too-small receive: {other:?}")),
    }
    let st = world.recv(Some(prev), Some(12), &mut small)?;
    t.expect(
        "after a truncation",
        (small[..3].to_vec(), st.count),
        (vec![8u32; 3], 3),
    );
    // A dropped receive is cancelled: the message sent after it (past a
    // barrier, so after the cancel) goes to the next receive.
    drop(world.irecv(Some(prev), Some(14), vec![0u32; 1])?);
    world.barrier()?;
    world.send(next, 14, &[99u32])?;
    let mut one = [0u32];
    world.recv(Some(prev), Some(14), &mut one)?;
    t.expect("a dropped receive takes nothing", one, [99]);
    if any_source {
        drop(world.irecv(None, Some(15), vec![0u32; 1])?);
        world.barrier()?;
        world.send(next, 15, &[98u32])?;
        world.recv(Some(prev), Some(15), &mut one)?;
        t.expect("a dropped any-source receive takes nothing", one, [98]);
    }
    probes(world, [(&dup, "dup"), (&half, "parity")], t)?;
    one_sided(world, t)?;
    // A wrong element type: a clear error.
    world.send(next, 13, &[1u8, 2, 3])?;
    let mut wide = [0u64; 4];
    match world.recv(Some(prev), Some(13), &mut wide) {
        Err(Error::Message { message, .. }) => t.expect(
            "a length that is not whole elements",
            message.contains("not a whole number of u64"),
            true,
        ),
        other => t.failed.push(format!("3 bytes into u64s: {other:?}")),
    }
    // The limit on live communicators, then room again once dropped.
    let mut held = Vec::new();
    let exhausted = loop {
        match world.dup() {
            Ok(c) => held.push(c),
            Err(e) => break e,
        }
    };
    // Contexts the splits above took: parity, node, reversed, dup, and
    // `none`'s wherever a rank took it (free only where every rank has it);
    // the World's own (its two levels, on pretend nodes); and those of the
    // communicators that span nodes and made their own (reversed and
    // `none`; a dup shares the World's).
    let mut own = [half.own_communicators()
        + node.own_communicators()
        + reversed.own_communicators()
        + dup.own_communicators()
        + none.as_ref().map_or(0, Comm::own_communicators)];
    world.allreduce(&mut own, Op::Max)?;
    let alive = 4 + usize::from(size > 1) + world.own_communicators() as usize + own[0] as usize;
    t.expect(
        "127 communicators at most",
        held.len() + alive,
        fabric_msg::world::MAX_CONTEXTS as usize - 1,
    );
    t.expect(
        "exhaustion says what to do",
        exhausted.to_string().contains("drop some first"),
        true,
    );
    // With few ids free, a communicator that spans nodes still works but
    // makes no two levels of its own (it keeps the ids for the program).
    held.truncate(held.len().saturating_sub(3));
    let late = world
        .split(Some(0), -i64::from(world.rank()))?
        .expect("one colour");
    t.expect(
        "no own two levels when ids are scarce",
        late.own_communicators(),
        0,
    );
    let mut sum = [u64::from(world.rank())];
    world.on(&late).allreduce(&mut sum, Op::Sum)?;
    t.expect(
        "an allreduce with ids scarce",
        sum[0],
        u64::from(size * (size - 1) / 2),
    );
    drop(late);
    drop(held);
    let again = world.dup()?;
    world.on(&again).barrier()?;
    Ok(())
}

/// Under `FABRIC_MSG_NODE` (ranks laid out on pretend nodes), a
/// communicator of this rank's pretend node: on fabric-msg's node
/// transport its blocking collectives run in its own slots (so two more
/// count in `WorldStats::node_collectives`) though the World's, spanning
/// nodes, are messages; and they give the right results.
fn pretend_node(world: &mut World, t: &mut Tally) -> fabric_msg::Result<()> {
    let Ok(name) = std::env::var("FABRIC_MSG_NODE") else {
        return Ok(());
    };
    let color = name
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        >> 1;
    let mine = world
        .split(Some(color), i64::from(world.rank()))?
        .expect("a colour");
    // split_shared follows the pretend node, not the launcher's host.
    t.expect(
        "a pretend node's ranks",
        world.node_ranks().to_vec(),
        mine.members().to_vec(),
    );
    let before = world.stats().node_collectives;
    let mut sum = [u64::from(world.rank())];
    world.on(&mine).barrier()?;
    world.on(&mine).allreduce(&mut sum, Op::Sum)?;
    let want: u64 = mine.members().iter().map(|&w| u64::from(w)).sum();
    t.expect("a pretend node's allreduce", sum[0], want);
    let node_transport = world.shm_report().contains("fabric-msg's node transport");
    let ran = world.stats().node_collectives - before;
    t.expect(
        "a pretend node's collectives in its slots",
        ran,
        if node_transport { 2 } else { 0 },
    );
    Ok(())
}

/// Probe and matched probe on two communicators: each rank sends
/// its successor a message whose length the receiver learns by probing,
/// a value, and two small messages; the receiver checks what the probes
/// say, that a matched message is taken by no other receive, and that a
/// dropped one is discarded. Where the fabric cannot peek (shm before
/// libfabric 1.19) it says so loudly and checks that the error says why.
fn probes(world: &mut World, comms: [(&Comm, &str); 2], t: &mut Tally) -> fabric_msg::Result<()> {
    let rank = world.rank();
    match world.iprobe(None, Some(23)) {
        Err(Error::Unsupported { what, provider }) => {
            eprintln!("model_check: rank {rank}: SKIPPED probes on {provider}: {what}");
            t.expect("the refusal says why", what.contains("FI_PEEK"), true);
            return Ok(());
        }
        other => t.expect("nothing waits with a tag never sent", other?, None),
    }
    for (comm, name) in comms {
        let mut view = world.on(comm);
        let (r, n) = (view.rank(), view.size());
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let len = |k: u32| 10 * (k as usize + 1);
        let mine: Vec<f64> = (0..len(r)).map(|i| f64::from(r) + i as f64).collect();
        let long = view.isend(next, 21, &mine)?;
        let sends = vec![
            view.isend(next, 24, &[r as u8; 3])?,
            view.isend(next, 25, &[1u8])?,
            view.isend(next, 25, &[2u8])?,
        ];
        view.send_value(next, 22, &format!("from {r}"))?;
        // Probe, then receive what it says.
        let env = view.probe(Some(prev), Some(21))?;
        t.expect(
            &format!("{name}: probe's envelope"),
            (env.source, env.tag, env.count::<f64>()),
            (prev, 21, Some(len(prev))),
        );
        // Matched: an any-tag receive posted before mrecv takes the next message.
        let m = view.mprobe(Some(prev), Some(21))?;
        let other = view.irecv::<u8>(Some(prev), None, Vec::with_capacity(16))?;
        let got: Vec<f64> = view.mrecv(m)?;
        let want: Vec<f64> = (0..len(prev)).map(|i| f64::from(prev) + i as f64).collect();
        t.expect(&format!("{name}: matched receive"), got, want);
        let (bytes, status) = world.wait_status(other)?;
        t.expect(
            &format!("{name}: the matched message was no one else's"),
            (bytes, status.tag),
            (vec![prev as u8; 3], 24),
        );
        let mut view = world.on(comm);
        // A dropped matched message is discarded.
        drop(view.mprobe(Some(prev), Some(25))?);
        let mut one = [0u8];
        view.recv(Some(prev), Some(25), &mut one)?;
        t.expect(
            &format!("{name}: a dropped matched message is discarded"),
            one,
            [2],
        );
        // A value whose size the probe learns, from any source.
        let m = view.mprobe(None, Some(22))?;
        t.expect(
            &format!("{name}: any-source matched probe's source"),
            m.envelope().source,
            prev,
        );
        let v: String = view.mrecv_value(m)?;
        t.expect(&format!("{name}: matched value"), v, format!("from {prev}"));
        t.expect(
            &format!("{name}: nothing left"),
            view.iprobe(Some(prev), None)?,
            None,
        );
        world.wait(long)?;
        world.wait_all(sends)?;
    }
    Ok(())
}

/// Put, get and atomics on symmetric memory through requests, a dropped
/// put made visible by `flush`, `load`/`store` of one's own part, and an
/// out-of-bounds put refused; every value checked.
fn one_sided(world: &mut World, t: &mut Tally) -> fabric_msg::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    let values = |r: u32| -> Vec<f64> { (0..16).map(|i| f64::from(r) * 100.0 + f64::from(i)).collect() };
    let mem = world.alloc_symmetric(4096, Access::ReadWrite)?;
    mem.store(3072, &[rank; 4])?;
    let put = world.put(right, &mem, 0, &values(rank))?;
    let add = world.fetch_atomic(0, Atomic::FetchAdd(u64::from(rank) + 1), &mem, 1024)?;
    t.expect("a put's result is empty", world.wait(put)?, Vec::<f64>::new());
    let old = world.wait(add)?;
    let total = u64::from(size) * u64::from(size + 1) / 2;
    t.expect(
        "fetch_atomic gives one old value, below the total",
        old.len() == 1 && old[0] < total,
        true,
    );
    // A dropped request's put still lands; flush waits for it.
    drop(world.put(right, &mem, 2048, &[rank + 7])?);
    world.flush(right)?;
    world.barrier()?;
    let mut got = [0.0f64; 16];
    mem.load(0, &mut got)?;
    t.expect("put from the left", got.to_vec(), values(left));
    let mut dropped = [0u32];
    mem.load(2048, &mut dropped)?;
    t.expect("a dropped put, flushed", dropped, [left + 7]);
    let mine = world.get::<f64>(right, &mem, 0, 16)?;
    let theirs = world.get::<u32>(right, &mem, 3072, 4)?;
    let counter = world.get::<u64>(0, &mem, 1024, 1)?;
    t.expect("get what this rank put", world.wait(mine)?, values(rank));
    t.expect("get what the target stored", world.wait(theirs)?, vec![right; 4]);
    t.expect(
        "every rank's atomic applied once",
        world.wait(counter)?,
        vec![total],
    );
    match world.put(right, &mem, 4090, &[0u64; 2]) {
        Err(Error::OutOfBounds {
            offset, len, size, ..
        }) => t.expect(
            "an out-of-bounds put says where",
            (offset, len, size),
            (4090, 16, 4096),
        ),
        other => t.failed.push(format!("a put past the end: {other:?}")),
    }
    world.barrier()?;
    world.free_symmetric(mem).map_err(|(_, e)| e)
}

fn trace(rank: u32, what: &str) {
    if std::env::var_os("MODEL_CHECK_TRACE").is_some() {
        eprintln!("rank {rank}: {what}");
    }
}

fn collectives_on_world(world: &mut World, t: &mut Tally) -> fabric_msg::Result<()> {
    let size = world.size();
    let mut v = [world.rank() as u64];
    world.allreduce(&mut v, Op::Sum)?;
    t.expect("world allreduce", v[0], u64::from(size * (size - 1) / 2));
    Ok(())
}

fn main() -> ExitCode {
    if std::env::args()
        .nth(1)
        .is_some_and(|a| a == "--help" || a == "-h")
    {
        println!("model_check: communicators, typed requests and serde messages between ranks (run under mpirun, srun or the rendezvous)");
        return ExitCode::SUCCESS;
    }
    let mut world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("model_check: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (rank, size) = (world.rank(), world.size());
    let mut tally = Tally::default();
    let outcome = run(&mut world, &mut tally);
    let slots = world.stats().node_collectives;
    println!("rank {rank}/{size}: {slots} collectives in the node's slots");
    let finished = world.finish();
    tally.report("model_check", (rank, size), outcome, finished)
}
