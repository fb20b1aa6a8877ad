//! What the library logs, where a program asks to see it: with
//! `FABRIC_MSG_LOG=json` one JSON object per record on stderr, with
//! `FABRIC_MSG_LOG=text` one line. Unset, nothing is installed and the
//! records go to whatever `log` logger the program set (or nowhere).
//!
//! Every record carries the time, level, target (the module), process id
//! and, once a World has formed, the rank (`set_rank`); records about a
//! peer, an operation or a failed libfabric call carry those as fields
//! (`peer`, `op`, `token`, `call`, `fi_errno`, `fi_error`, ...), written
//! with `log`'s key-values: `log::warn!(peer = 3, op = "send"; "...")`.
//! So a job's logs from every rank can be merged (`sort` by `ts`) and
//! filtered (`jq 'select(.peer == 3)'`).
//!
//! `FABRIC_MSG_LOG_LEVEL` (`error`, `warn`, `info`, `debug`, `trace`)
//! sets the level, `warn` by default.

use log::kv::{Key, Value, VisitSource};
use std::io::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Once;

/// This process's rank once a World formed; -1 before.
static RANK: AtomicI64 = AtomicI64::new(-1);

/// Name the rank every later record carries.
pub(crate) fn set_rank(rank: u32) {
    RANK.store(i64::from(rank), Ordering::Relaxed);
}

/// How records are written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    Json,
    Text,
}

struct Logger {
    format: Format,
    level: log::LevelFilter,
}

/// Install the logger `FABRIC_MSG_LOG` asks for, once per process; a
/// logger the program installed first wins. Called by `World::init` and
/// `EventLoop::new`.
pub fn init_from_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let format = match std::env::var("FABRIC_MSG_LOG").as_deref() {
            Ok("json") => Format::Json,
            Ok("text") | Ok("1") => Format::Text,
            _ => return,
        };
        let level = std::env::var("FABRIC_MSG_LOG_LEVEL")
            .ok()
            .and_then(|l| l.parse().ok())
            .unwrap_or(log::LevelFilter::Warn);
        if log::set_boxed_logger(Box::new(Logger { format, level })).is_ok() {
            log::set_max_level(level);
        }
    });
}

/// Collects a record's key-values as JSON.
struct Fields(serde_json::Map<String, serde_json::Value>);

impl<'kvs> VisitSource<'kvs> for Fields {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        let v = if let Some(n) = value.to_i64() {
            serde_json::Value::from(n)
        } else if let Some(n) = value.to_u64() {
            serde_json::Value::from(n)
        } else if let Some(b) = value.to_bool() {
            serde_json::Value::from(b)
        } else {
            serde_json::Value::from(value.to_string())
        };
        self.0.insert(key.as_str().to_owned(), v);
        Ok(())
    }
}

impl Logger {
    fn line(&self, record: &log::Record<'_>) -> String {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let rank = RANK.load(Ordering::Relaxed);
        let mut fields = Fields(serde_json::Map::new());
        // A key-value that cannot be read is left out, not fatal.
        let _ = record.key_values().visit(&mut fields);
        match self.format {
            Format::Json => {
                let mut o = serde_json::Map::new();
                o.insert("ts".into(), serde_json::Value::from((ts * 1e6).round() / 1e6));
                o.insert("level".into(), record.level().as_str().into());
                o.insert("target".into(), record.target().into());
                o.insert("pid".into(), std::process::id().into());
                if rank >= 0 {
                    o.insert("rank".into(), rank.into());
                }
                o.insert("msg".into(), record.args().to_string().into());
                for (k, v) in fields.0 {
                    o.entry(k).or_insert(v);
                }
                serde_json::Value::Object(o).to_string()
            }
            Format::Text => {
                let who = if rank >= 0 {
                    format!("rank {rank}")
                } else {
                    format!("pid {}", std::process::id())
                };
                let mut line = format!("fabric-msg {who} {}: {}", record.level(), record.args());
                for (k, v) in fields.0 {
                    line.push_str(&format!(" {k}={v}"));
                }
                line
            }
        }
    }
}

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let mut line = self.line(record);
        line.push('\n');
        // One write per record, so lines from threads do not interleave;
        // a closed stderr is not the library's failure.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::{Format, Logger};

    #[test]
    fn a_record_is_one_json_object_with_its_fields() {
        let l = Logger {
            format: Format::Json,
            level: log::LevelFilter::Warn,
        };
        let kvs: &[(&str, log::kv::Value<'_>)] = &[
            ("peer", log::kv::Value::from(3u32)),
            ("op", log::kv::Value::from("send")),
            ("fi_errno", log::kv::Value::from(103u32)),
        ];
        let line = l.line(
            &log::Record::builder()
                .level(log::Level::Warn)
                .target("fabric_msg::transport")
                .args(format_args!("peer 3 lost: \"died\"\nnewline"))
                .key_values(&kvs)
                .build(),
        );
        assert!(!line.contains('\n'), "one line: {line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["peer"], 3);
        assert_eq!(v["op"], "send");
        assert_eq!(v["fi_errno"], 103);
        assert_eq!(v["msg"], "peer 3 lost: \"died\"\nnewline");
        assert!(v["ts"].as_f64().unwrap() > 1.0e9);
    }
}
