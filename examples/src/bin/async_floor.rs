//! `async_floor`: what tokio itself adds to a hand-off between two tasks,
//! with no fabric at all — the floor under `async_pingpong`'s latency.
//!
//! Two sides pass a counter back and forth through two shared atomic
//! words, as a ping-pong passes a message: each stores its number, then
//! waits for the other's. `threads` waits as the blocking tool does, a
//! thread spinning on a load; the tokio rows wait as fabric-msg's futures
//! do (`async_loop/op.rs`): one load a poll, then wake itself and let the
//! runtime run its other tasks before the next (every 16th time through
//! `yield_now`, which also polls the runtime's drivers).
//!
//! ```text
//! async_floor [round trips]      # prints one-way µs: threads, 2 workers, 1 thread, a runtime per side
//! ```
//!
//! The difference between the rows is what a runtime's turn costs on the
//! way from one side's store to the other's load; fabric-msg's adapter
//! cannot be faster than its row (docs/benchmarks.md, "The runtime's
//! floor").

use std::future::poll_fn;
use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

/// The two words: `ping` is the client's last number, `pong` the server's.
#[derive(Default)]
struct Words {
    ping: AtomicU64,
    pong: AtomicU64,
}

/// As `async_loop/op.rs`: every 16th turn yields to the runtime's drivers.
const DEFER_EVERY: u32 = 16;

/// Be polled again once the runtime has run its other tasks.
async fn again() {
    let mut woken = false;
    poll_fn(|cx| {
        if woken {
            return Poll::Ready(());
        }
        woken = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Wait, as a future, until `word` holds `n`.
async fn until(word: &AtomicU64, n: u64) {
    let mut turns = 0u32;
    while word.load(Ordering::Acquire) != n {
        turns = turns.wrapping_add(1);
        if turns % DEFER_EVERY == 0 {
            tokio::task::yield_now().await;
        } else {
            again().await;
        }
    }
}

async fn client(w: Arc<Words>, n: u64) -> f64 {
    let start = Instant::now();
    for i in 1..=n {
        w.ping.store(i, Ordering::Release);
        until(&w.pong, i).await;
    }
    start.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64
}

async fn server(w: Arc<Words>, n: u64) {
    for i in 1..=n {
        until(&w.ping, i).await;
        w.pong.store(i, Ordering::Release);
    }
}

fn spin_until(word: &AtomicU64, n: u64) {
    while word.load(Ordering::Acquire) != n {
        spin_loop();
    }
}

fn threads(n: u64) -> f64 {
    let w = Arc::new(Words::default());
    let s = w.clone();
    let server = std::thread::spawn(move || {
        for i in 1..=n {
            spin_until(&s.ping, i);
            s.pong.store(i, Ordering::Release);
        }
    });
    let start = Instant::now();
    for i in 1..=n {
        w.ping.store(i, Ordering::Release);
        spin_until(&w.pong, i);
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64;
    server.join().expect("the server thread panicked");
    us
}

/// Both sides as spawned tasks of one runtime.
fn on_one_runtime(rt: tokio::runtime::Runtime, n: u64) -> f64 {
    rt.block_on(async {
        let w = Arc::new(Words::default());
        let s = tokio::spawn(server(w.clone(), n));
        let us = tokio::spawn(client(w, n)).await.expect("the client task");
        s.await.expect("the server task");
        us
    })
}

fn workers(n: u64) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    on_one_runtime(rt, n)
}

fn one_thread(n: u64) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    on_one_runtime(rt, n)
}

fn per_side(n: u64) -> f64 {
    let w = Arc::new(Words::default());
    let s = w.clone();
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let server = std::thread::spawn(move || {
        let rt = rt();
        rt.block_on(async { tokio::spawn(server(s, n)).await.expect("the server task") })
    });
    let us = rt().block_on(async { tokio::spawn(client(w, n)).await.expect("the client task") });
    server.join().expect("the server thread panicked");
    us
}

fn main() {
    let n = match std::env::args().nth(1).map(|a| a.parse::<u64>()) {
        None => 200_000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: async_floor [round trips, at least 1]");
            std::process::exit(2);
        }
    };
    type Row = (&'static str, fn(u64) -> f64);
    let rows: [Row; 4] = [
        ("threads", threads),
        ("2 workers", workers),
        ("1 thread", one_thread),
        ("a runtime per side", per_side),
    ];
    for (name, f) in rows {
        // A tenth as warm-up, then the measured run.
        f((n / 10).max(1));
        println!("{name}: {:.3} µs one way", f(n));
    }
}
