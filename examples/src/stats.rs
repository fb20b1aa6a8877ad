//! Per-iteration times and their percentiles: what every tool records in
//! its timed loop ([`IterTimes`]), what it reports beside the average
//! ([`Tail`]: p50, p99, p99.9, min and max), and how the table and `--json`
//! show them.
//!
//! The timed loop only stores numbers into memory sized before the loop,
//! so recording allocates nothing per message; the histogram
//! (`hdrhistogram`, three significant digits) is built after the loop.
//! `FABRIC_MSG_ITER_TIMES=off` turns the per-iteration clock reads off, to
//! measure what the timing itself costs (`ci/bench/iter_times_cost.sh`;
//! docs/benchmarks.md, "Percentiles in every tool"), and
//! `FABRIC_MSG_ITER_TIMES=alternate` measures that cost inside one run:
//! blocks of [`BLOCK`] iterations with the reads on and off by turns
//! ([`Alternation`]).

use hdrhistogram::Histogram;
use std::time::Instant;

/// The environment variable that turns per-iteration timing off (`off` or
/// `0`); anything else, or nothing, leaves it on.
pub const ITER_TIMES_ENV: &str = "FABRIC_MSG_ITER_TIMES";

/// Whether the tools time each iteration (see [`ITER_TIMES_ENV`]).
pub fn iter_times_on() -> bool {
    !matches!(std::env::var(ITER_TIMES_ENV).as_deref(), Ok("off" | "0"))
}

/// Whether [`ITER_TIMES_ENV`] asks for timing on and off by turns.
fn alternating() -> bool {
    matches!(std::env::var(ITER_TIMES_ENV).as_deref(), Ok("alternate"))
}

/// Iterations per block of `FABRIC_MSG_ITER_TIMES=alternate`: long enough
/// that the block's two clock reads weigh nothing (one in a thousand
/// iterations), short enough that a run of a few seconds has hundreds of
/// blocks, so that on and off blocks see the same machine.
pub const BLOCK: u32 = 1000;

/// What the per-iteration timing costs, measured inside one run: the mean
/// time per transfer of the blocks with it on and of the blocks with it
/// off, which alternate every [`BLOCK`] iterations over one connection.
/// Run-to-run spread (process placement, load) is shared by both halves
/// rather than compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alternation {
    /// Mean µs per transfer over the blocks timed per iteration.
    pub on_us: f64,
    /// Mean µs per transfer over the blocks without per-iteration reads.
    pub off_us: f64,
    /// Complete blocks of each kind (the fewer of the two).
    pub blocks: u64,
}

/// The running sums behind an [`Alternation`].
#[derive(Debug)]
struct Blocks {
    laps: u32,
    began: Instant,
    /// Nanoseconds and transfers of the on blocks ([0]) and off blocks ([1]).
    nanos: [u64; 2],
    xfers: [u64; 2],
    count: [u64; 2],
    xfers_now: u64,
}

impl Blocks {
    /// No block ended yet; the first begins at `began`.
    fn from(began: Instant) -> Blocks {
        Blocks {
            laps: 0,
            began,
            nanos: [0; 2],
            xfers: [0; 2],
            count: [0; 2],
            xfers_now: 0,
        }
    }
}

/// Times of a size's measured iterations, in nanoseconds per transfer,
/// recorded into a vector sized before the loop.
#[derive(Debug)]
pub struct IterTimes {
    on: bool,
    nanos: Vec<u64>,
    last: Instant,
    /// With `FABRIC_MSG_ITER_TIMES=alternate`: `on` flips every block.
    blocks: Option<Box<Blocks>>,
}

impl IterTimes {
    /// Room for `iterations` times; with timing off, none is kept.
    pub fn new(iterations: usize) -> IterTimes {
        IterTimes::with(iterations, iter_times_on(), alternating())
    }

    /// Room for `iterations` times, timing `on` or off, or on and off by
    /// turns if `alternate`.
    fn with(iterations: usize, on: bool, alternate: bool) -> IterTimes {
        let now = Instant::now();
        IterTimes {
            on,
            nanos: Vec::with_capacity(if on { iterations } else { 0 }),
            last: now,
            blocks: alternate.then(|| Box::new(Blocks::from(now))),
        }
    }

    /// Room for `iterations` times, kept whatever [`ITER_TIMES_ENV`] says:
    /// for loops that time every iteration anyway (world_bench's latency
    /// and collectives, as OSU's do), where only the storing is new, and
    /// where every rank must record alike.
    pub fn always(iterations: usize) -> IterTimes {
        IterTimes {
            on: true,
            nanos: Vec::with_capacity(iterations),
            last: Instant::now(),
            blocks: None,
        }
    }

    /// Whether iterations are timed.
    pub fn on(&self) -> bool {
        self.on
    }

    /// The measured iterations begin at `at` (the clock the average uses):
    /// forget earlier laps.
    pub fn start(&mut self, at: Instant) {
        self.nanos.clear();
        self.last = at;
        if let Some(b) = &mut self.blocks {
            **b = Blocks::from(at);
            self.on = true;
        }
    }

    /// An iteration of `per` transfers has ended: its time since the
    /// previous lap (or [`IterTimes::start`]), divided by `per`. Past the
    /// room made in [`IterTimes::new`] laps are dropped, never allocated.
    #[inline]
    pub fn lap(&mut self, per: usize) {
        if self.on {
            let now = Instant::now();
            self.record(now.duration_since(self.last).as_nanos() as u64 / per.max(1) as u64);
            self.last = now;
        }
        if self.blocks.is_some() {
            self.block_lap(per);
        }
    }

    /// `FABRIC_MSG_ITER_TIMES=alternate`: count the lap into its block;
    /// at the block's end, add its time to its kind and flip timing.
    #[cold]
    fn block_lap(&mut self, per: usize) {
        let Some(b) = self.blocks.as_deref_mut() else {
            return;
        };
        b.laps += 1;
        b.xfers_now += per as u64;
        if b.laps < BLOCK {
            return;
        }
        let now = Instant::now();
        let kind = usize::from(!self.on);
        b.nanos[kind] += now.duration_since(b.began).as_nanos() as u64;
        b.xfers[kind] += b.xfers_now;
        b.count[kind] += 1;
        (b.laps, b.xfers_now, b.began) = (0, 0, now);
        self.on = !self.on;
        // The first lap of the next on block starts at this block's end.
        self.last = now;
    }

    /// With `FABRIC_MSG_ITER_TIMES=alternate`, the on and off blocks'
    /// means; `None` otherwise or before a block of each kind has ended.
    pub fn alternation(&self) -> Option<Alternation> {
        let b = self.blocks.as_deref()?;
        let mean = |k: usize| b.nanos[k] as f64 / 1e3 / b.xfers[k].max(1) as f64;
        (b.count[0] > 0 && b.count[1] > 0).then(|| Alternation {
            on_us: mean(0),
            off_us: mean(1),
            blocks: b.count[0].min(b.count[1]),
        })
    }

    /// The measured time from `start`: to the last lap, so that the
    /// average and the percentiles come from the same clock reads (a
    /// preemption after the last lap cannot put the average above the
    /// slowest iteration); to now with timing off or no lap.
    pub fn elapsed_since(&self, start: Instant) -> std::time::Duration {
        if self.on && !self.nanos.is_empty() {
            self.last.duration_since(start)
        } else {
            start.elapsed()
        }
    }

    /// Record a time measured elsewhere, in nanoseconds per transfer.
    #[inline]
    pub fn record(&mut self, nanos: u64) {
        if self.on && self.nanos.len() < self.nanos.capacity() {
            self.nanos.push(nanos);
        }
    }

    /// The recorded times, in order.
    pub fn nanos(&self) -> &[u64] {
        &self.nanos
    }

    /// The recorded times, to combine with other ranks' in place.
    pub fn nanos_mut(&mut self) -> &mut [u64] {
        &mut self.nanos
    }

    /// Their percentiles, or `None` with timing off or nothing recorded.
    pub fn tail(&self) -> Option<Tail> {
        let mut t = Tail::of(&self.nanos)?;
        t.alternation = self.alternation();
        Some(t)
    }
}

/// The distribution of per-iteration times, microseconds per transfer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tail {
    /// Fastest iteration.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest iteration.
    pub max: f64,
    /// How many iterations.
    pub count: u64,
    /// With `FABRIC_MSG_ITER_TIMES=alternate`, the timing's cost measured
    /// in the run (the percentiles are then of the on blocks only).
    pub alternation: Option<Alternation>,
}

impl Tail {
    /// The percentiles of `nanos`, or `None` if it is empty. Values are
    /// kept to three significant digits (hdrhistogram's precision here):
    /// within 0.1 %, `min` rounded down, the others up.
    pub fn of(nanos: &[u64]) -> Option<Tail> {
        if nanos.is_empty() {
            return None;
        }
        // 1 ns to an hour: any time a tool can take. Out of range cannot
        // happen below; a value above is clamped to the top.
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).ok()?;
        for &n in nanos {
            h.saturating_record(n.max(1));
        }
        let us = |v: u64| v as f64 / 1e3;
        Some(Tail {
            min: us(h.min()),
            p50: us(h.value_at_quantile(0.5)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            count: h.len(),
            alternation: None,
        })
    }

    /// Add `p50_us`, `p99_us`, `p999_us`, `min_us` and `max_us` to a JSON
    /// object.
    pub fn add_json(&self, v: &mut serde_json::Value) {
        v["p50_us"] = self.p50.into();
        v["p99_us"] = self.p99.into();
        v["p999_us"] = self.p999.into();
        v["min_us"] = self.min.into();
        v["max_us"] = self.max.into();
        if let Some(a) = &self.alternation {
            v["timed_us"] = a.on_us.into();
            v["untimed_us"] = a.off_us.into();
            v["alternate_blocks"] = a.blocks.into();
        }
    }
}

/// The table's percentile column names, each `width` wide.
pub fn columns(width: usize) -> String {
    ["p50", "p99", "p99.9", "max"]
        .iter()
        .map(|c| format!(" {c:>width$}"))
        .collect()
}

/// A row's percentile columns (`-` for each with timing off), each `width`
/// wide, two decimals.
pub fn cells(tail: Option<&Tail>, width: usize) -> String {
    match tail {
        Some(t) => [t.p50, t.p99, t.p999, t.max]
            .iter()
            .map(|v| format!(" {v:>width$.2}"))
            .collect(),
        None => (0..4).map(|_| format!(" {:>width$}", "-")).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::{cells, IterTimes, Tail, BLOCK};

    #[test]
    fn percentiles_of_a_known_distribution() {
        // 1..=1000 µs: p50 500, p99 990, p99.9 999, within 0.1 %.
        let nanos: Vec<u64> = (1..=1000).map(|k| k * 1000).collect();
        let t = Tail::of(&nanos).expect("not empty");
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 1e-9;
        assert!(near(t.min, 1.0), "{t:?}");
        assert!(near(t.p50, 500.0), "{t:?}");
        assert!(near(t.p99, 990.0), "{t:?}");
        assert!(near(t.p999, 999.0), "{t:?}");
        assert!(near(t.max, 1000.0), "{t:?}");
        assert_eq!(t.count, 1000);
        assert!(t.min <= t.p50 && t.p50 <= t.p99 && t.p99 <= t.p999 && t.p999 <= t.max);
        assert_eq!(Tail::of(&[]), None);
    }

    #[test]
    fn one_slow_iteration_shows_in_the_tail_only() {
        let mut nanos = vec![2_000u64; 999];
        nanos.push(5_000_000);
        let t = Tail::of(&nanos).expect("not empty");
        assert!(t.p50 < 2.01 && t.p99 < 2.01, "{t:?}");
        assert!(t.max > 4_990.0, "{t:?}");
        assert_eq!(cells(None, 5), "     -     -     -     -");
    }

    #[test]
    fn alternate_times_every_other_block_and_means_both() {
        let n = 4 * BLOCK as usize + 10;
        let mut t = IterTimes::with(n, true, true);
        t.start(std::time::Instant::now());
        for _ in 0..n {
            std::hint::black_box(std::time::Instant::now());
            t.lap(2);
        }
        // Blocks 1 and 3 timed, 2 and 4 not, then 10 laps of a fifth.
        assert_eq!(t.nanos().len(), 2 * BLOCK as usize + 10);
        let tail = t.tail().expect("laps were timed");
        let a = tail.alternation.expect("two blocks of each kind ended");
        assert_eq!(a.blocks, 2);
        assert!(a.on_us > 0.0 && a.off_us > 0.0, "{a:?}");
        // Per transfer: each lap was 2 transfers, so well under a lap.
        assert!(a.on_us < 1_000.0 && a.off_us < 1_000.0, "{a:?}");
        let mut plain = IterTimes::with(n, true, false);
        plain.lap(1);
        assert_eq!(plain.alternation(), None);
        assert_eq!(plain.tail().expect("one lap").alternation, None);
    }
}
