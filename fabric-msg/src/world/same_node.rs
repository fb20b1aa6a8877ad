//! Which ranks talk over shared memory beside the World's fabric
//! (`local.rs` is the loop that carries them): a rank's node, whether it
//! opens the second loop, which pairs both ends agree on, and how the
//! World reports them. Every rank computes the same answers from the same
//! tables.

/// This rank's node: `FABRIC_MSG_NODE` where set (for testing layouts:
/// one machine standing in for several nodes), otherwise the host name.
pub(crate) fn node_name(over: Option<&str>, host: String) -> String {
    over.map_or(host, str::to_string)
}

/// Whether this rank should open a same-node loop: the option is on,
/// another rank is on its node, and (for libfabric's shm, `node`
/// false) the world is not on `shm` already. `None` if so, otherwise why
/// not.
pub(crate) fn wanted(
    on: bool,
    node: bool,
    world_provider: &str,
    nodes: &[String],
    rank: u32,
) -> Option<String> {
    if !on {
        return Some("turned off (FABRIC_MSG_SHM=0)".into());
    }
    if !node && world_provider == "shm" {
        return Some("the world is on shm already".into());
    }
    let Some(me) = nodes.get(rank as usize) else {
        return Some(format!(
            "rank {rank} is not in the table of {} nodes",
            nodes.len()
        ));
    };
    let others = nodes
        .iter()
        .enumerate()
        .any(|(r, n)| r != rank as usize && n == me);
    (!others).then(|| format!("no other rank on node {me}"))
}

/// Every rank on `rank`'s node, ascending (their places are their node
/// indices on the node loop).
pub(crate) fn node_ranks(rank: u32, nodes: &[String]) -> Vec<u32> {
    let Some(me) = nodes.get(rank as usize) else {
        return Vec::new();
    };
    (0..nodes.len() as u32)
        .filter(|&r| nodes[r as usize] == *me)
        .collect()
}

/// The ranks this rank reaches over shared memory, from every rank's node
/// and publication: the same answer on every rank.
/// `has[r]`: whether rank `r` published an shm endpoint.
pub(crate) fn pairs_of(rank: u32, nodes: &[String], has: &[bool]) -> Vec<u32> {
    let me = rank as usize;
    let (Some(true), Some(node)) = (has.get(me), nodes.get(me)) else {
        return Vec::new();
    };
    (0..has.len().min(nodes.len()))
        .filter(|&r| r != me && nodes[r] == *node && has[r])
        .map(|r| r as u32)
        .collect()
}

/// Whether the World runs its collectives in two levels
/// (`two_level.rs`): it spans nodes, some node has several ranks, and every
/// rank not alone on its node published a node-transport endpoint
/// (`has_node[r]`). The same answer on every rank.
pub(crate) fn two_levels(nodes: &[String], has_node: &[bool]) -> bool {
    let per_node = per_node(nodes);
    spread(&per_node)
        && nodes.len() == has_node.len()
        && nodes
            .iter()
            .zip(has_node)
            .all(|(n, &has)| has || per_node[n] == 1)
}

/// For each rank, whether another rank shares its node.
pub(crate) fn with_others(nodes: &[String]) -> Vec<bool> {
    let per_node = per_node(nodes);
    nodes.iter().map(|n| per_node[n] > 1).collect()
}

/// For each rank, its node's place among the nodes ordered by their
/// lowest rank: the rank of its node's leader (the node's lowest rank)
/// in the leaders' communicator of the two levels, which orders its
/// leaders by rank (`two_level.rs`). `nodes`: each rank's node, by any
/// name.
pub(crate) fn leader_places<N: Eq + std::hash::Hash>(nodes: &[N]) -> Vec<u32> {
    let mut places = std::collections::HashMap::<&N, u32>::new();
    nodes
        .iter()
        .map(|n| {
            let next = places.len() as u32;
            *places.entry(n).or_insert(next)
        })
        .collect()
}

/// Each rank's node named by the lowest rank on it: what a split carries
/// for every rank (`comm.rs`), and the same names `node_ranks` gives.
pub(crate) fn node_ids(names: &[String]) -> Vec<u32> {
    let mut first = std::collections::HashMap::<&str, u32>::new();
    names
        .iter()
        .enumerate()
        .map(|(r, n)| *first.entry(n.as_str()).or_insert(r as u32))
        .collect()
}

/// How many ranks each node of `nodes` (each rank's node) has.
fn per_node<N: Eq + std::hash::Hash>(nodes: &[N]) -> std::collections::HashMap<&N, usize> {
    let mut per_node = std::collections::HashMap::new();
    for n in nodes {
        *per_node.entry(n).or_default() += 1;
    }
    per_node
}

/// Whether ranks on `nodes` (each rank's node) span nodes and some node
/// has several of them: where two levels can help.
pub(crate) fn spans<N: Eq + std::hash::Hash>(nodes: &[N]) -> bool {
    spread(&per_node(nodes))
}

/// [`spans`], from the count of ranks on each node.
fn spread<N>(per_node: &std::collections::HashMap<&N, usize>) -> bool {
    per_node.len() > 1 && per_node.values().any(|&n| n > 1)
}

/// The words `World::fabric_report` adds for the same-node pairs; `how`:
/// what carries them.
pub(crate) fn report(rank: u32, ranks: &[u32], how: &str, world_label: &str) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    format!(
        "rank {rank} reaches rank{} {} over {how} (same node), the others over {world_label}",
        if ranks.len() > 1 { "s" } else { "" },
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::{leader_places, node_ids, node_ranks, pairs_of, spans, two_levels, wanted};

    #[test]
    fn pairs_are_the_same_node_ranks_that_both_published_one() {
        let nodes: Vec<String> = ["a", "a", "b", "b", "a"].iter().map(|s| s.to_string()).collect();
        let table = [true, true, true, true, false];
        assert_eq!(pairs_of(0, &nodes, &table), vec![1]);
        assert_eq!(pairs_of(1, &nodes, &table), vec![0]);
        assert_eq!(pairs_of(2, &nodes, &table), vec![3]);
        assert_eq!(pairs_of(4, &nodes, &table), Vec::<u32>::new());
        for a in 0..5u32 {
            for b in pairs_of(a, &nodes, &table) {
                assert!(pairs_of(b, &nodes, &table).contains(&a), "{a}-{b} is symmetric");
            }
        }
    }

    #[test]
    fn tables_of_different_lengths_pair_nothing_they_do_not_both_hold() {
        let nodes: Vec<String> = ["a", "a"].iter().map(|s| s.to_string()).collect();
        assert_eq!(pairs_of(0, &nodes, &[true, true, true]), vec![1]);
        assert_eq!(pairs_of(2, &nodes, &[true, true, true]), Vec::<u32>::new());
        assert_eq!(pairs_of(5, &nodes, &[true]), Vec::<u32>::new());
        assert!(wanted(true, true, "tcp;ofi_rxm", &nodes, 7).is_some());
    }

    #[test]
    fn a_same_node_loop_is_wanted_only_beside_another_rank() {
        let nodes: Vec<String> = ["a", "a", "b"].iter().map(|s| s.to_string()).collect();
        for node in [true, false] {
            assert_eq!(wanted(true, node, "tcp;ofi_rxm", &nodes, 0), None);
            assert!(wanted(true, node, "tcp;ofi_rxm", &nodes, 2).is_some());
            assert!(wanted(false, node, "tcp;ofi_rxm", &nodes, 0).is_some());
        }
        // libfabric's shm is not opened twice; the node loop beats the
        // world's shm, so it is opened beside it.
        assert!(wanted(true, false, "shm", &nodes, 0).is_some());
        assert_eq!(wanted(true, true, "shm", &nodes, 0), None);
    }

    #[test]
    fn a_node_is_named_by_its_lowest_rank_and_two_levels_need_two_nodes_one_shared() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(node_ids(&names(&["b", "a", "b", "c", "a"])), vec![0, 1, 0, 3, 1]);
        // A communicator's ranks on those nodes: the same places as names give.
        let ids = [4u32, 4, 9, 2, 9];
        assert_eq!(leader_places(&ids), vec![0, 0, 1, 2, 1]);
        assert!(spans(&ids));
        assert!(!spans(&[4u32, 4]), "one node");
        assert!(!spans(&[1u32, 2, 3]), "every rank alone");
        assert!(!spans::<u32>(&[]));
    }

    #[test]
    fn two_levels_where_nodes_are_several_and_every_shared_one_has_the_transport() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Two nodes of two; one alone beside two (it needs no transport).
        assert!(two_levels(&names(&["a", "a", "b", "b"]), &[true; 4]));
        assert!(two_levels(&names(&["a", "b", "b"]), &[false, true, true]));
        // One node; every rank alone; a shared node's rank without it.
        assert!(!two_levels(&names(&["a", "a"]), &[true; 2]));
        assert!(!two_levels(&names(&["a", "b", "c"]), &[false; 3]));
        assert!(!two_levels(
            &names(&["a", "a", "b", "b"]),
            &[true, true, true, false]
        ));
        // Tables of different lengths: no.
        assert!(!two_levels(&names(&["a", "a", "b"]), &[true; 2]));
    }

    #[test]
    fn a_ranks_leader_place_is_its_nodes_order_by_lowest_rank() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            leader_places(&names(&["b", "a", "b", "c", "a"])),
            vec![0, 1, 0, 2, 1]
        );
        assert_eq!(leader_places(&names(&["a", "a"])), vec![0, 0]);
        assert!(leader_places::<String>(&[]).is_empty());
    }

    #[test]
    fn node_indices_are_places_among_the_nodes_ranks() {
        let nodes: Vec<String> = ["a", "b", "a", "b", "a"].iter().map(|s| s.to_string()).collect();
        assert_eq!(node_ranks(4, &nodes), vec![0, 2, 4]);
        assert_eq!(node_ranks(1, &nodes), vec![1, 3]);
        assert_eq!(node_ranks(9, &nodes), Vec::<u32>::new());
    }
}
