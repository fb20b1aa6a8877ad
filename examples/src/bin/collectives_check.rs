//! `collectives_check`: every collective of the World, on every element type
//! and op, checked against a sequential reference computed on each rank.
//! All ranks draw the same cases from the seed, and each rank can draw every
//! rank's input, so each rank checks its own result without trusting any
//! other rank. Prints one line per rank; non-zero exit on any difference or
//! error.
//!
//! ```text
//! mpirun -np 5 target/release/collectives_check
//! for r in 0 1 2; do FABRIC_MSG_RANK=$r FABRIC_MSG_SIZE=3 \
//!     FABRIC_MSG_ROOT=127.0.0.1:9300 target/release/collectives_check & done; wait
//! ```
//!
//! usage: collectives_check [--messages] [--seed N] [--quick] [--dup-first]
//!                                            --messages: no collective through the node's
//!                                            shared-memory slots (node_collectives off)
//!                                            --dup-first: a dup of the World first, its
//!                                            non-blocking calls and the World's started in
//!                                            different orders on odd and even ranks
//!        collectives_check --loop BYTES      allreduce f64 of BYTES until an error (failure tests)
//!        collectives_check --mismatch        the last rank passes one element more to an allreduce
//!        collectives_check --mismatch --lengths FIRST,OTHERS
//!                                            rank 0 passes FIRST i32 to an allreduce, the others OTHERS
//!        collectives_check --bad-op          the last rank asks for a bitwise allreduce of floats
//!        ... --mismatch | --bad-op  --call reduce|broadcast
//!                                            the same misuse in a reduce to the last rank, or
//!                                            (--mismatch only) a broadcast from rank 0
//!        ... --mismatch --call barrier      the last rank calls an allreduce where the others
//!                                            call a barrier
//!        ... --mismatch --call ibarrier     the last rank calls ibarrier and waits where the
//!                                            others call barrier
//!        ... --loop | --mismatch | --bad-op  --on-comm
//!                                            the same on a communicator of the whole World in
//!                                            reverse order: its last rank (world rank 0) misuses
//!        collectives_check --bad-scatterv    the root passes one count too few to a scatterv
//!        collectives_check --late SECS       the last rank computes SECS before a barrier, an
//!                                            allreduce and a broadcast the others are in
//!        collectives_check --alltoallv-mismatch
//!                                            rank 1 expects one element more from rank 0 than it sends

use fabric_msg::{Buffer, Element, Op, OpKind, Reduction, Token, World, WorldConfig};
use fabric_msg_examples::rng::Rng;
use misuse::{reversed, roles, Misused};
use options::{parse, Mode};
use std::fmt::Debug;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[path = "collectives_check/comm.rs"]
mod comm;
#[path = "collectives_check/misuse.rs"]
mod misuse;
#[path = "collectives_check/more.rs"]
mod more;
#[path = "collectives_check/options.rs"]
mod options;
#[path = "collectives_check/slots.rs"]
mod slots;

/// Collectives of communicators run in two levels by the checks
/// (`comm.rs`), left out of the World's count.
static COMM_TWO_LEVEL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What the reference needs of an element: random values and the ops.
trait Value: Element + Debug {
    const FLOAT: bool;
    fn random(rng: &mut Rng) -> Self;
    fn apply(op: Op, a: Self, b: Self) -> Self;
    /// The custom reduction: the value with the larger magnitude (ties: the larger).
    fn bigger(a: Self, b: Self) -> Self;
}

macro_rules! int_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            const FLOAT: bool = false;
            fn random(rng: &mut Rng) -> Self { rng.next() as $t }
            fn apply(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Sum => a.wrapping_add(b),
                    Op::Prod => a.wrapping_mul(b),
                    Op::Min => a.min(b),
                    Op::Max => a.max(b),
                    Op::BitAnd => a & b,
                    Op::BitOr => a | b,
                    Op::BitXor => a ^ b,
                    _ => a,
                }
            }
            #[allow(unused_comparisons)]
            fn bigger(a: Self, b: Self) -> Self {
                let mag = |x: Self| if x < 0 { (x as i128).unsigned_abs() } else { x as u128 };
                if (mag(b), b) > (mag(a), a) { b } else { a }
            }
        }
    )*};
}
int_value!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            const FLOAT: bool = true;
            // Small integers: sums and products are exact in any order
            // (products of up to 24 values in -2..=2 fit f32's mantissa).
            fn random(rng: &mut Rng) -> Self { rng.below(5) as $t - 2.0 }
            fn apply(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Sum => a + b,
                    Op::Prod => a * b,
                    Op::Min => a.min(b),
                    Op::Max => a.max(b),
                    _ => a,
                }
            }
            fn bigger(a: Self, b: Self) -> Self {
                if (b.abs(), b) > (a.abs(), a) { b } else { a }
            }
        }
    )*};
}
float_value!(f32, f64);

#[derive(Default)]
struct Tally {
    checks: usize,
    failures: Vec<String>,
}

impl Tally {
    fn expect<T: PartialEq + Debug>(&mut self, what: &str, got: &[T], want: &[T]) {
        self.checks += 1;
        if got != want && self.failures.len() < 8 {
            let show = |v: &[T]| format!("{:?}{}", &v[..v.len().min(6)], if v.len() > 6 { "…" } else { "" });
            self.failures.push(format!(
                "{what}: got {} elements {}, expected {} elements {}",
                got.len(),
                show(got),
                want.len(),
                show(want)
            ));
        }
    }
}

/// Rank `q`'s input of case `case`, of `n` elements.
fn input<T: Value>(seed: u64, case: u64, q: u32, n: usize) -> Vec<T> {
    let mut rng = Rng::new(&[seed, case, u64::from(q)]);
    (0..n).map(|_| T::random(&mut rng)).collect()
}

fn fold<T: Value>(inputs: &[Vec<T>], f: impl Fn(T, T) -> T) -> Vec<T> {
    let mut acc = inputs[0].clone();
    for v in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(v) {
            *a = f(*a, *b);
        }
    }
    acc
}

struct Ctx<'a> {
    world: &'a mut World,
    seed: u64,
    case: u64,
    tally: Tally,
    sizes: Vec<usize>,
    /// How many of the World's non-blocking checks ran in its node's slots
    /// (`slots.rs`): a communicator with slots runs as many in its own.
    nb_in_slots: u64,
    /// How many of those went by one copy (larger than a slot).
    nb_copied: u64,
}

impl Ctx<'_> {
    fn next_case(&mut self) -> (u64, Rng) {
        self.case += 1;
        (self.case, Rng::new(&[self.seed, self.case, 0xc0ffee]))
    }

    /// Counts per rank, some 0, for the v-collectives.
    fn counts(rng: &mut Rng, size: u32, big: bool) -> Vec<usize> {
        (0..size)
            .map(|_| match rng.below(5) {
                0 => 0,
                1 if big => 3000 + rng.below(2000) as usize,
                _ => 1 + rng.below(9) as usize,
            })
            .collect()
    }

    fn all_inputs<T: Value>(&self, case: u64, counts: &[usize]) -> Vec<Vec<T>> {
        (0..counts.len() as u32)
            .map(|q| input(self.seed, case, q, counts[q as usize]))
            .collect()
    }

    fn run<T: Value>(&mut self) -> fabric_msg::Result<()> {
        let (rank, size) = (self.world.rank(), self.world.size());
        let name = std::any::type_name::<T>();
        let ops: Vec<Op> = Op::ALL
            .into_iter()
            .filter(|o| !(T::FLOAT && o.is_bitwise()))
            .collect();
        for n in self.sizes.clone() {
            // broadcast
            let (case, mut rng) = self.next_case();
            let root = rng.below(u64::from(size)) as u32;
            let want: Vec<T> = input(self.seed, case, root, n);
            let mut data = if rank == root {
                want.clone()
            } else {
                vec![T::random(&mut rng); n]
            };
            self.world.broadcast(root, &mut data)?;
            self.tally
                .expect(&format!("broadcast {name} n={n} root={root}"), &data, &want);
            // gather and allgather, equal lengths
            let (case, mut rng) = self.next_case();
            let root = rng.below(u64::from(size)) as u32;
            let inputs: Vec<Vec<T>> = self.all_inputs(case, &vec![n; size as usize]);
            let got = self.world.gather(root, &inputs[rank as usize])?;
            let want = if rank == root { inputs.concat() } else { vec![] };
            self.tally
                .expect(&format!("gather {name} n={n} root={root}"), &got, &want);
            let got = self.world.allgather(&inputs[rank as usize])?;
            self.tally
                .expect(&format!("allgather {name} n={n}"), &got, &inputs.concat());
            // reduce and allreduce with every op, and a custom one
            for &op in &ops {
                let (case, mut rng) = self.next_case();
                let root = rng.below(u64::from(size)) as u32;
                let inputs: Vec<Vec<T>> = self.all_inputs(case, &vec![n; size as usize]);
                let want = fold(&inputs, |a, b| T::apply(op, a, b));
                let mut data = inputs[rank as usize].clone();
                self.world.allreduce(&mut data, op)?;
                self.tally
                    .expect(&format!("allreduce {name} {op:?} n={n}"), &data, &want);
                let mut data = inputs[rank as usize].clone();
                self.world.reduce(root, &mut data, op)?;
                let want = if rank == root {
                    want
                } else {
                    inputs[rank as usize].clone()
                };
                self.tally
                    .expect(&format!("reduce {name} {op:?} n={n} root={root}"), &data, &want);
            }
            let (case, _) = self.next_case();
            let inputs: Vec<Vec<T>> = self.all_inputs(case, &vec![n; size as usize]);
            let mut data = inputs[rank as usize].clone();
            self.world.allreduce(&mut data, Reduction::custom(bigger::<T>))?;
            self.tally.expect(
                &format!("allreduce {name} custom n={n}"),
                &data,
                &fold(&inputs, T::bigger),
            );
        }
        self.more::<T>(&ops)?;
        // The v-collectives and reduce-scatter: uneven counts, zeros among them.
        for big in [false, true] {
            let (case, mut rng) = self.next_case();
            let counts = Self::counts(&mut rng, size, big);
            let root = rng.below(u64::from(size)) as u32;
            let inputs: Vec<Vec<T>> = self.all_inputs(case, &counts);
            let got = self.world.gatherv(root, &inputs[rank as usize], &counts)?;
            let want = if rank == root { inputs.concat() } else { vec![] };
            self.tally.expect(
                &format!("gatherv {name} counts={counts:?} root={root}"),
                &got,
                &want,
            );
            let got = self.world.allgatherv(&inputs[rank as usize], &counts)?;
            self.tally.expect(
                &format!("allgatherv {name} counts={counts:?}"),
                &got,
                &inputs.concat(),
            );
            let total: usize = counts.iter().sum();
            let (case, mut rng) = self.next_case();
            let op = ops[rng.below(ops.len() as u64) as usize];
            let vectors: Vec<Vec<T>> = self.all_inputs(case, &vec![total; size as usize]);
            let got = self.world.reduce_scatter(&vectors[rank as usize], &counts, op)?;
            let at: usize = counts[..rank as usize].iter().sum();
            let want = fold(&vectors, |a, b| T::apply(op, a, b))[at..at + counts[rank as usize]].to_vec();
            self.tally.expect(
                &format!("reduce_scatter {name} {op:?} counts={counts:?}"),
                &got,
                &want,
            );
        }
        Ok(())
    }

    /// Non-blocking collectives in flight together, waited for out of
    /// order, while the application's own messages go around a ring.
    fn overlapped(&mut self) -> fabric_msg::Result<()> {
        let (rank, size) = (self.world.rank(), self.world.size());
        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
        self.world
            .recv_buffer(Some(prev), Some(5), Buffer::new(8), Token(50))?;
        self.world.send_buffer(
            next,
            5,
            Buffer::from_slice(&u64::from(rank).to_le_bytes()),
            Token(51),
        )?;
        let (case, _) = self.next_case();
        let inputs: Vec<Vec<u64>> = self.all_inputs(case, &vec![3000; size as usize]);
        let a = self.world.iallreduce(inputs[rank as usize].clone(), Op::Sum)?;
        let b = self.world.ibroadcast(size - 1, inputs[rank as usize].clone())?;
        let c = self.world.ibarrier()?;
        let d = self.world.iallgatherv(
            vec![rank as u8; rank as usize],
            &(0..size as usize).collect::<Vec<_>>(),
        )?;
        self.world.wait(c)?;
        let got_d = self.world.wait(d)?;
        let got_b = self.world.wait(b)?;
        let got_a = self.world.wait(a)?;
        self.tally
            .expect("iallreduce", &got_a, &fold(&inputs, |x, y| x.wrapping_add(y)));
        self.tally
            .expect("ibroadcast", &got_b, &inputs[size as usize - 1]);
        let want_d: Vec<u8> = (0..size).flat_map(|q| vec![q as u8; q as usize]).collect();
        self.tally.expect("iallgatherv", &got_d, &want_d);
        // The ring's completions were kept for World::poll.
        let mut seen = Vec::new();
        let mut out = Vec::new();
        let until = Instant::now() + Duration::from_secs(30);
        while seen.len() < 2 && Instant::now() < until {
            self.world.poll(&mut out, Some(Duration::from_millis(100)))?;
            for c in out.drain(..) {
                let from = c
                    .buffer
                    .as_ref()
                    .map(|b| b.as_slice().to_vec())
                    .unwrap_or_default();
                seen.push((
                    c.token,
                    c.kind,
                    if c.kind == OpKind::Recv { from } else { vec![] },
                ));
            }
        }
        let mut want = vec![
            (Token(50), OpKind::Recv, u64::from(prev).to_le_bytes().to_vec()),
            (Token(51), OpKind::Send, vec![]),
        ];
        seen.sort_by_key(|s| s.0 .0);
        want.sort_by_key(|s| s.0 .0);
        self.tally
            .expect("application completions around collectives", &seen, &want);
        Ok(())
    }
}

/// One line on stderr in one write: under `mpirun`, lines of several ranks
/// must not interleave.
fn say_err(line: &str) {
    use std::io::Write;
    std::io::stderr().write_all(format!("{line}\n").as_bytes()).ok();
}

fn bigger<T: Value>(acc: &mut [T], other: &[T]) {
    for (a, b) in acc.iter_mut().zip(other) {
        *a = T::bigger(*a, *b);
    }
}

fn main() -> ExitCode {
    let (mode, messages, misused, on_comm) = match parse() {
        Ok(m) => m,
        Err(e) => {
            say_err(&format!("collectives_check: {e}"));
            return ExitCode::from(2);
        }
    };
    let cfg = WorldConfig::from_env().map(|c| WorldConfig {
        node_collectives: c.node_collectives && !messages,
        ..c
    });
    let mut world = match cfg.and_then(World::init_with) {
        Ok(w) => w,
        Err(e) => {
            say_err(&format!("collectives_check: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let (rank, size) = (world.rank(), world.size());
    let started = Instant::now();
    let outcome = match mode {
        Mode::Check {
            seed,
            quick,
            dup_first,
        } => check(&mut world, seed, quick, dup_first),
        Mode::Loop(bytes) => reversed(&mut world, on_comm).and_then(|comm| {
            let mut v = vec![1.0f64; bytes / 8];
            let mut n = 0u64;
            loop {
                let done = match (&comm, misused) {
                    // Two in flight, waited for last first: a queue of
                    // non-blocking calls (by one copy on one node, where
                    // larger than a slot).
                    (None, Misused::Iallreduce) => two_iallreduces(&mut world, &mut v),
                    (Some(c), _) => world.on(c).allreduce(&mut v, Op::Sum),
                    (None, _) => world.allreduce(&mut v, Op::Sum),
                };
                if let Err(e) = done {
                    break Err(e);
                }
                n += 1;
                if n == 1 {
                    println!("rank {rank}: looping");
                }
                v.fill(1.0);
            }
        }),
        Mode::Mismatch(lengths) => reversed(&mut world, on_comm).and_then(|comm| {
            let (me, last) = roles(&world, comm.as_ref());
            let len = match lengths {
                Some((first, _)) if me == 0 => first,
                Some((_, others)) => others,
                None if me == last => 1001,
                None => 1000,
            };
            let mut v = vec![1i32; len];
            misused
                .run(&mut world, comm.as_ref(), &mut v, Op::Sum)
                .map(|()| Ok(0))
        }),
        Mode::BadOp => reversed(&mut world, on_comm).and_then(|comm| {
            let (me, last) = roles(&world, comm.as_ref());
            let op = if me == last { Op::BitXor } else { Op::Sum };
            misused
                .run(&mut world, comm.as_ref(), &mut [1.0f64; 16], op)
                .map(|()| Ok(0))
        }),
        Mode::BadScatterv => more::bad_scatterv(&mut world),
        Mode::AlltoallvMismatch => more::alltoallv_mismatch(&mut world),
        Mode::Late(secs) => more::late(&mut world, secs),
    };
    let secs = started.elapsed().as_secs_f64();
    let provider = world.profile().provider.clone();
    let launcher = world.launcher();
    match outcome {
        Ok(Ok(checks)) => {
            println!("rank {rank}/{size}: {checks} checks passed in {secs:.2} s ({provider} via {launcher})");
            let slots = world.stats().node_collectives;
            println!("rank {rank}/{size}: {slots} collectives in the node's slots");
            let copied = world.stats().node_single_copy_collectives;
            println!("rank {rank}/{size}: {copied} collectives read with one copy");
            // The World's own: the communicators' are counted apart (above).
            let two = world.stats().two_level_collectives
                - COMM_TWO_LEVEL.load(std::sync::atomic::Ordering::Relaxed);
            println!("rank {rank}/{size}: {two} collectives in two levels");
            // Of all those (the World's and its communicators'), the
            // non-blocking and persistent ones.
            let requests = world.stats().two_level_requests;
            println!("rank {rank}/{size}: {requests} non-blocking collectives in two levels");
            match world.finish() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    say_err(&format!("collectives_check: rank {rank}: {e}"));
                    ExitCode::FAILURE
                }
            }
        }
        Ok(Err(failures)) => {
            for f in failures {
                println!("rank {rank}/{size}: FAILED {f}");
            }
            if let Err(e) = world.finish() {
                say_err(&format!("collectives_check: rank {rank}: {e}"));
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            say_err(&format!(
                "collectives_check: rank {rank}: {e} (after {secs:.2} s)"
            ));
            // Leave in order where the others are alive, so a launcher that
            // ends the job on the first failed exit cannot cut their say short.
            if !matches!(e, fabric_msg::Error::RankLost { .. }) {
                world.finish().ok();
            }
            ExitCode::FAILURE
        }
    }
}

/// `--loop` with `--call iallreduce`: two non-blocking allreduces of `v`'s
/// length in flight, the second waited for first; `v` becomes the first's
/// result.
fn two_iallreduces(world: &mut World, v: &mut Vec<f64>) -> fabric_msg::Result<()> {
    let len = v.len();
    let first = world.iallreduce(std::mem::take(v), Op::Sum)?;
    let second = world.iallreduce(vec![1.0f64; len], Op::Sum)?;
    world.wait(second)?;
    *v = world.wait(first)?;
    Ok(())
}

/// Every check; `Ok(Ok(count))` when all passed.
fn check(
    world: &mut World,
    seed: u64,
    quick: bool,
    dup_first: bool,
) -> fabric_msg::Result<Result<usize, Vec<String>>> {
    let sizes = if quick { vec![0, 1, 7] } else { vec![0, 1, 7, 1000] };
    let mut ctx = Ctx {
        world,
        seed,
        case: 0,
        tally: Tally::default(),
        sizes,
        nb_in_slots: 0,
        nb_copied: 0,
    };
    ctx.world.barrier()?;
    // A dup made before any non-blocking call shares the World's two
    // levels where it spans nodes, so neither's non-blocking calls go
    // through them (they may be started in different orders on different
    // ranks): both, started so, are right.
    let _dup = match dup_first {
        true => {
            let dup = ctx.world.dup()?;
            ctx.two_queues(&dup)?;
            Some(dup)
        }
        false => None,
    };
    ctx.run::<i8>()?;
    ctx.run::<i16>()?;
    ctx.run::<u16>()?;
    ctx.run::<i64>()?;
    ctx.run::<u32>()?;
    if !quick {
        // Long vectors, over every algorithm's threshold.
        ctx.sizes = vec![3000, 40000];
    }
    ctx.run::<u8>()?;
    ctx.run::<i32>()?;
    ctx.run::<u64>()?;
    ctx.run::<f32>()?;
    ctx.run::<f64>()?;
    ctx.overlapped()?;
    ctx.slots()?;
    let comm = ctx.communicator()?;
    COMM_TWO_LEVEL.store(comm, std::sync::atomic::Ordering::Relaxed);
    let (rank, size) = (ctx.world.rank(), ctx.world.size());
    println!("rank {rank}/{size}: {comm} collectives of a communicator in two levels");
    // Of the World's non-blocking and persistent checks in `slots.rs`.
    println!(
        "rank {rank}/{size}: {} non-blocking calls by one copy",
        ctx.nb_copied
    );
    if quick {
        // One long broadcast, past the switch to scatter + allgather where
        // the world is large enough for it.
        let (case, mut rng) = ctx.next_case();
        let root = rng.below(u64::from(ctx.world.size())) as u32;
        let want: Vec<f64> = input(ctx.seed, case, root, 40000);
        let mut data = if ctx.world.rank() == root {
            want.clone()
        } else {
            vec![0.0; 40000]
        };
        ctx.world.broadcast(root, &mut data)?;
        ctx.tally
            .expect(&format!("broadcast f64 n=40000 root={root}"), &data, &want);
    }
    ctx.world.barrier()?;
    // A last non-blocking barrier never waited for: `World::finish` finishes
    // it (in the node's slots on one node), and no rank is left waiting.
    drop(ctx.world.ibarrier()?);
    let t = ctx.tally;
    Ok(if t.failures.is_empty() {
        Ok(t.checks)
    } else {
        Err(t.failures)
    })
}
