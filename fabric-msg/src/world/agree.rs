//! One fabric for the whole world. Each rank negotiates on its own and
//! publishes its choice as a position on the ladder (0 is the same-host
//! rung, then the ladder's rungs in order). The world takes the worst
//! first choice — the best rung every rank can reach — and every rank that
//! chose better opens that rung instead. Every rank computes the same
//! decision from the same table, so all report the same choice and why.

use crate::discovery::config::LadderConfig;
use crate::discovery::info::EndpointType;
use crate::discovery::plan::rung_label;
use crate::discovery::profile::Profile;
use serde::{Deserialize, Serialize};

/// What one rank could open, as it tells the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Choice {
    /// The host it runs on.
    pub host: String,
    /// Its first choice, or why it has none.
    pub rung: Result<ChosenRung, String>,
}

/// A rung, where it stands on the ladder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChosenRung {
    /// 0: the same-host rung; `i + 1`: the ladder's rung `i`.
    pub position: u32,
    /// e.g. `tcp via tcp;ofi_rxm (rdm)`.
    pub label: String,
    pub provider: String,
    pub endpoint: EndpointType,
}

impl ChosenRung {
    /// The rung `profile` was opened on, placed on `ladder`.
    pub(crate) fn of(profile: &Profile, ladder: &LadderConfig) -> ChosenRung {
        let same = ladder.same_host.iter().map(|r| (0, r));
        let rungs = ladder.rungs.iter().enumerate().map(|(i, r)| (i as u32 + 1, r));
        let position = same
            .chain(rungs)
            .find(|(_, r)| rung_label(r) == profile.rung)
            .map_or(u32::MAX, |(p, _)| p);
        ChosenRung {
            position,
            label: profile.rung.clone(),
            provider: profile.provider.clone(),
            endpoint: profile.endpoint_type,
        }
    }
}

/// What the world will use, and why, in words every rank prints alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    pub rung: ChosenRung,
    /// Set where some rank had a better first choice.
    pub why: Option<String>,
}

/// The best rung every rank reaches, from every rank's choice (by rank).
pub(crate) fn decide(choices: &[Choice]) -> Result<Decision, String> {
    let n = choices.len();
    let mut worst: Option<(usize, &ChosenRung)> = None;
    for (rank, c) in choices.iter().enumerate() {
        match &c.rung {
            Err(why) => return Err(format!("rank {rank} (on {}) has no usable fabric: {why}", c.host)),
            Ok(r) if worst.map_or(true, |(_, w)| r.position > w.position) => worst = Some((rank, r)),
            Ok(_) => {}
        }
    }
    let (_, rung) = worst.ok_or_else(|| "a world of no ranks".to_string())?;
    let better: Vec<usize> = (0..n)
        .filter(|&r| matches!(&choices[r].rung, Ok(c) if c.position < rung.position))
        .collect();
    let why = (!better.is_empty()).then(|| {
        let held: Vec<String> = (0..n)
            .filter(|&r| matches!(&choices[r].rung, Ok(c) if c.position == rung.position))
            .map(|r| r.to_string())
            .collect();
        let best = better
            .iter()
            .filter_map(|&r| choices[r].rung.as_ref().ok())
            .min_by_key(|c| c.position)
            .map_or("", |c| c.label.as_str());
        format!(
            "rank{} {} can reach nothing better than {}: using it for all {n} ranks (rank{} {} preferred {best})",
            if held.len() > 1 { "s" } else { "" },
            held.join(", "),
            rung.label,
            if better.len() > 1 { "s" } else { "" },
            better.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", "),
        )
    });
    Ok(Decision {
        rung: rung.clone(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(position: u32, label: &str) -> Choice {
        Choice {
            host: "n1".into(),
            rung: Ok(ChosenRung {
                position,
                label: label.into(),
                provider: label.split(' ').nth(2).unwrap_or("").into(),
                endpoint: EndpointType::Rdm,
            }),
        }
    }

    #[test]
    fn the_worst_first_choice_wins_and_says_who_and_why() {
        let roce = "roce via verbs;ofi_rxm (rdm)";
        let tcp = "tcp via tcp;ofi_rxm (rdm)";
        let d = decide(&[at(3, roce), at(3, roce), at(3, roce), at(8, tcp)]).unwrap();
        assert_eq!(d.rung.label, tcp);
        let why = d.why.unwrap();
        assert!(
            why.starts_with(
                "rank 3 can reach nothing better than tcp via tcp;ofi_rxm (rdm): using it for all 4 ranks"
            ),
            "{why}"
        );
        assert!(why.contains("ranks 0, 1, 2 preferred roce"), "{why}");
        let same = decide(&[at(8, tcp), at(8, tcp)]).unwrap();
        assert_eq!((same.rung.label.as_str(), same.why), (tcp, None));
    }

    #[test]
    fn a_rank_without_a_fabric_fails_the_world_naming_it() {
        let mut none = at(0, "x");
        none.host = "n7".into();
        none.rung = Err("no provider".into());
        let e = decide(&[at(8, "tcp via tcp;ofi_rxm (rdm)"), none]).unwrap_err();
        assert_eq!(e, "rank 1 (on n7) has no usable fabric: no provider");
    }
}
