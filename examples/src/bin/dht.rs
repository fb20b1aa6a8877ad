//! A distributed hash table on symmetric memory, written as an MPI
//! programmer would write it, beside its C + MPI twin
//! (`examples/mpi/dht.c`, `MPI_Win_allocate` with passive-target
//! `MPI_Compare_and_swap`, `MPI_Put` and `MPI_Get`): every rank owns
//! `slots` slots of two words (key, value); a key's owner and first slot
//! come from its hash, and linear probing finds a free one. Each rank
//! inserts `n` keys — a remote compare-and-swap claims the slot, a put
//! writes the value — and after a barrier looks every one of them up with
//! a remote get. Both programs print the same checksum for the same
//! arguments, and the time both phases took (the slowest rank's).
//!
//! ```text
//! mpirun -np 4 dht [keys per rank] [slots per rank] [auto|mapped|never]
//! ```
//!
//! On one node the World maps the ranks' parts into each other
//! (`world/node_symmetric.rs`), so each operation is a CPU atomic or copy;
//! `FABRIC_MSG_SHM=libfabric` sends each through libfabric's shm instead.
//! The third argument is the table's `NodeSharing` (`auto` by default):
//! across nodes whose fabric has native atomics, `mapped` maps each node's
//! parts anyway and emulates the other nodes' atomics.

use fabric_msg::{Access, Atomic, NodeSharing, Op, World};
use std::time::Instant;

/// splitmix64: a key's hash.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn main() -> Result<(), fabric_msg::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok());
    let n = number(0).unwrap_or(100_000);
    let slots = number(1).unwrap_or(2 * n + 1);
    let sharing = match args.get(2).map(String::as_str) {
        None | Some("auto") => NodeSharing::Auto,
        Some("mapped") => NodeSharing::Mapped,
        Some("never") => NodeSharing::Never,
        Some(other) => {
            eprintln!("dht: the third argument is auto, mapped or never, not {other:?}");
            std::process::exit(2);
        }
    };

    let mut world = World::init()?;
    let (rank, size) = (u64::from(world.rank()), u64::from(world.size()));
    let table = world.alloc_symmetric_with(slots as usize * 16, Access::ReadWrite, sharing)?;
    let key = |i: u64| rank * n + i + 1; // never 0, which marks a free slot
    let home = |k: u64| ((mix(k) % size) as u32, (mix(k) >> 32) % slots);

    world.barrier()?;
    let start = Instant::now();
    for i in 0..n {
        let k = key(i);
        let (owner, mut slot) = home(k);
        loop {
            let claim = Atomic::CompareSwap { expected: 0, new: k };
            let req = world.fetch_atomic(owner, claim, &table, slot * 16)?;
            let old = world.wait(req)?[0];
            if old == 0 || old == k {
                let req = world.put(owner, &table, slot * 16 + 8, &[3 * k])?;
                world.wait(req)?;
                break;
            }
            slot = (slot + 1) % slots;
        }
    }
    world.barrier()?;
    let mut checksum = 0u64;
    let mut missing = 0u64;
    for i in 0..n {
        let k = key(i);
        let (owner, mut slot) = home(k);
        loop {
            let req = world.get::<u64>(owner, &table, slot * 16, 2)?;
            let entry = world.wait(req)?;
            if entry[0] == k {
                checksum = checksum.wrapping_add(entry[1]);
                break;
            }
            if entry[0] == 0 {
                missing += 1;
                break;
            }
            slot = (slot + 1) % slots;
        }
    }
    let mut secs = [start.elapsed().as_secs_f64()];
    world.allreduce(&mut secs, Op::Max)?;
    let mut sums = [checksum, missing];
    world.allreduce(&mut sums, Op::Sum)?;
    if rank == 0 {
        let ops = 2.0 * (n * size) as f64;
        println!(
            "dht ranks {size} keys {n} slots {slots} checksum {} missing {} time {:.4} s rate {:.3} Mops/s",
            sums[0],
            sums[1],
            secs[0],
            ops / secs[0] / 1e6
        );
    }
    world.barrier()?;
    world.free_symmetric(table).map_err(|(_, e)| e)?;
    world.finish()
}
