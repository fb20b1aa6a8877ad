//! The control protocol of `pingpong` and `bandwidth`: the [`Plan`] the
//! client sends (what to measure, checked on both sides before anything is
//! allocated) and the [`Ctrl`] messages that keep the two sides in step,
//! each a few little-endian words decoded with every length and count
//! checked. See `session.rs` for how they are exchanged.

use crate::opts::{Opts, Tool, MAX_ITERS, MAX_SIZES, MAX_WINDOW};
use crate::session::BUFFER_BUDGET;
use fabric_msg::Profile;

/// Capacity of a control message buffer.
pub(crate) const CTRL_CAP: usize = 1024;

/// What the client asks the server to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The tool.
    pub tool: Tool,
    /// Message sizes, in order.
    pub sizes: Vec<usize>,
    /// Measured messages per size.
    pub iters: usize,
    /// Warm-up messages per size.
    pub warmup: usize,
    /// Messages in flight (bandwidth).
    pub window: usize,
    /// Check every byte.
    pub verify: bool,
    /// Tagged data messages.
    pub tagged: bool,
}

impl Plan {
    /// The plan the options describe.
    pub fn from_opts(o: &Opts) -> Plan {
        Plan {
            tool: o.tool,
            sizes: o.sizes.clone(),
            iters: o.iters,
            warmup: o.warmup,
            window: o.window,
            verify: o.verify,
            tagged: o.tagged,
        }
    }

    /// The largest size.
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// Messages per size, warm-up included.
    pub fn messages(&self) -> usize {
        self.warmup + self.iters
    }

    /// Whether this side can run the plan with `profile`, messages of at
    /// most `max_msg` bytes; if not, why.
    pub fn check(&self, tool: Tool, profile: &Profile, max_msg: u64) -> Result<(), String> {
        if self.tool != tool {
            return Err(format!(
                "a {} client cannot use a {} server: run the same tool on both sides",
                self.tool.name(),
                tool.name()
            ));
        }
        if self.sizes.is_empty() || self.sizes.len() > MAX_SIZES {
            return Err(format!("1 to {MAX_SIZES} sizes, not {}", self.sizes.len()));
        }
        // The plan may come from a peer: every count is bounded before any
        // arithmetic uses it.
        if !(1..=MAX_WINDOW).contains(&self.window)
            || !(1..=MAX_ITERS).contains(&self.iters)
            || self.warmup > MAX_ITERS
        {
            return Err(format!(
                "window {}, {} iterations and {} warm-up messages: out of range (window 1 to \
                 {MAX_WINDOW}, iterations 1 to {MAX_ITERS}, warm-up at most {MAX_ITERS})",
                self.window, self.iters, self.warmup
            ));
        }
        if self.tagged && !profile.caps_granted.iter().any(|c| c == "FI_TAGGED") {
            return Err(
                "the client sends tagged messages and this side negotiated without FI_TAGGED: \
                 start both sides with --msg, or neither"
                    .into(),
            );
        }
        let max = self.max_size();
        if max as u64 > max_msg {
            return Err(format!(
                "-S {max}: larger than the {max_msg}-byte messages `{}` allows",
                profile.provider
            ));
        }
        let need = max.saturating_mul(match tool {
            Tool::PingPong | Tool::RmaPingPong => 3,
            Tool::Bandwidth => self.window,
        });
        if need > BUFFER_BUDGET {
            return Err(format!(
                "-S {max}{}: {need} bytes of buffers, more than the {BUFFER_BUDGET} allowed",
                match tool {
                    Tool::Bandwidth => format!(" with -w {}", self.window),
                    Tool::PingPong | Tool::RmaPingPong => String::new(),
                }
            ));
        }
        Ok(())
    }
}

/// A control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ctrl {
    /// Client to server: what to run.
    Plan(Plan),
    /// Server to client: receives for size `index` are posted.
    Ready {
        /// Index in the plan's sizes.
        index: usize,
    },
    /// Server to client (bandwidth): `count` messages of the window arrived.
    Ack {
        /// Messages received.
        count: usize,
    },
    /// Either side: the run is over.
    Done,
    /// Server to client: the plan cannot be run, and why.
    Refused(String),
}

const KIND_PLAN: u64 = 1;
const KIND_READY: u64 = 2;
const KIND_ACK: u64 = 3;
const KIND_DONE: u64 = 4;
const KIND_REFUSED: u64 = 5;
/// "fmsgbnch": the first word of every control message, with the kind in
/// the low byte.
const MAGIC: u64 = 0x666d_7367_626e_6300;

impl Ctrl {
    /// Encode into `out` (at least `CTRL_CAP` bytes); returns the length.
    pub(crate) fn encode(&self, out: &mut [u8]) -> usize {
        let mut w = Words { out, at: 0 };
        match self {
            Ctrl::Plan(p) => {
                w.put(MAGIC | KIND_PLAN);
                w.put(p.tool.id());
                w.put(u64::from(p.verify) | u64::from(p.tagged) << 1);
                for n in [p.iters, p.warmup, p.window, p.sizes.len()] {
                    w.put(n as u64);
                }
                for &s in &p.sizes {
                    w.put(s as u64);
                }
            }
            Ctrl::Ready { index } => {
                w.put(MAGIC | KIND_READY);
                w.put(*index as u64);
            }
            Ctrl::Ack { count } => {
                w.put(MAGIC | KIND_ACK);
                w.put(*count as u64);
            }
            Ctrl::Done => w.put(MAGIC | KIND_DONE),
            Ctrl::Refused(why) => {
                w.put(MAGIC | KIND_REFUSED);
                let n = why.len().min(CTRL_CAP - 8);
                w.out[8..8 + n].copy_from_slice(&why.as_bytes()[..n]);
                w.at += n;
            }
        }
        w.at
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Ctrl, String> {
        let word = |i: usize| -> Result<u64, String> {
            b.get(i * 8..i * 8 + 8)
                .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
                .ok_or_else(|| format!("control message of {} bytes is cut short", b.len()))
        };
        let first = word(0)?;
        if first & !0xff != MAGIC {
            return Err("the peer is not this tool (bad control message)".into());
        }
        let n = |i| word(i).map(|v| v as usize);
        Ok(match first & 0xff {
            KIND_PLAN => {
                let tool = Tool::from_id(word(1)?).ok_or("the client is an unknown tool")?;
                let flags = word(2)?;
                let count = n(6)?.min(MAX_SIZES + 1);
                Ctrl::Plan(Plan {
                    tool,
                    verify: flags & 1 != 0,
                    tagged: flags & 2 != 0,
                    iters: n(3)?,
                    warmup: n(4)?,
                    window: n(5)?,
                    sizes: (0..count).map(|i| n(7 + i)).collect::<Result<_, _>>()?,
                })
            }
            KIND_READY => Ctrl::Ready { index: n(1)? },
            KIND_ACK => Ctrl::Ack { count: n(1)? },
            KIND_DONE => Ctrl::Done,
            KIND_REFUSED => Ctrl::Refused(String::from_utf8_lossy(&b[8..]).into_owned()),
            k => return Err(format!("unknown control message kind {k}")),
        })
    }
}

struct Words<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Words<'_> {
    fn put(&mut self, v: u64) {
        self.out[self.at..self.at + 8].copy_from_slice(&v.to_le_bytes());
        self.at += 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_round_trip() {
        let plan = Plan {
            tool: Tool::Bandwidth,
            sizes: crate::opts::all_sizes(),
            iters: 7,
            warmup: 3,
            window: 64,
            verify: true,
            tagged: false,
        };
        let mut b = [0u8; CTRL_CAP];
        for c in [
            Ctrl::Plan(plan),
            Ctrl::Ready { index: 4 },
            Ctrl::Ack { count: 64 },
            Ctrl::Done,
            Ctrl::Refused("no".into()),
        ] {
            let n = c.encode(&mut b);
            assert_eq!(Ctrl::decode(&b[..n]), Ok(c));
        }
        assert!(Ctrl::decode(&[0u8; 8]).unwrap_err().contains("not this tool"));
        assert!(Ctrl::decode(&b[..4]).unwrap_err().contains("cut short"));
        let n = Ctrl::Ready { index: 1 }.encode(&mut b);
        assert!(Ctrl::decode(&b[..n - 1]).is_err());
    }

    /// A plan is checked on the side that receives it: counts a peer sends
    /// that would overflow `warmup + iters` (or the byte totals) are
    /// refused before anything is run.
    #[test]
    fn a_plan_with_overflowing_counts_is_refused() {
        let req = fabric_msg::Requirements {
            provider: Some("tcp;ofi_rxm".into()),
            ..Default::default()
        };
        let profile = fabric_msg::negotiate(&req, &fabric_msg::LadderConfig::default())
            .unwrap()
            .profile;
        let good = Plan {
            tool: Tool::PingPong,
            sizes: vec![64],
            iters: 10,
            warmup: 1,
            window: 1,
            verify: false,
            tagged: true,
        };
        assert_eq!(good.check(Tool::PingPong, &profile, 1 << 20), Ok(()));
        for (iters, warmup) in [(usize::MAX, 1), (1, usize::MAX), (MAX_ITERS + 1, 0)] {
            let plan = Plan {
                iters,
                warmup,
                ..good.clone()
            };
            let e = plan.check(Tool::PingPong, &profile, 1 << 20).unwrap_err();
            assert!(e.contains("out of range"), "{e}");
        }
        let e = crate::opts::parse(
            Tool::PingPong,
            ["-I", "18446744073709551615"].iter().map(|s| s.to_string()),
        );
        assert!(format!("{e:?}").contains("1 to 1000000000 iterations"), "{e:?}");
    }
}
