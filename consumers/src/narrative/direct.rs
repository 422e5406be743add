//! Which facts of a narrative pass are placed directly, in their own request's narrative,
//! without entering the graph (the rule is [`super::projector::Projector`]'s `load_named`).

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::graph::NodeKey;
use super::projector::SparedLink;

/// Which facts of a pass are placed directly (see `Projector::load_named`): a candidate
/// (`candidates`: own id → the one fact that has it, if it may be direct) whose own id is
/// `absent` from memory after the load, whose every target is spared or direct, and whose
/// own id no fact that is not direct names. Knocking one out can knock out others, so this
/// runs to a fixpoint (two rounds when nothing changes after the first).
pub(super) fn direct_facts(
    n: usize,
    candidates: &HashMap<NodeKey, Option<usize>>,
    targets: &[(usize, NodeKey)],
    absent: impl Fn(&NodeKey) -> bool,
    spared: &[(NodeKey, SparedLink<'_>)],
) -> Vec<bool> {
    let mut direct = vec![false; n];
    for (own, i) in candidates {
        if let Some(i) = i {
            direct[*i] = absent(own);
        }
    }
    let spared: HashSet<&NodeKey> = spared.iter().map(|(k, _)| k).collect();
    let direct_own = |k: &NodeKey| candidates.get(k).copied().flatten();
    let mut changed = true;
    while changed {
        changed = false;
        for (j, k) in targets {
            let named = direct_own(k);
            if let Some(i) = named {
                if direct[i] && !direct[*j] {
                    direct[i] = false;
                    changed = true;
                }
            }
            let fine = spared.contains(k) || named.is_some_and(|i| direct[i]);
            if direct[*j] && !fine {
                direct[*j] = false;
                changed = true;
            }
        }
    }
    direct
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_schemas::links::NodeKind;
    use weft_schemas::Kind;

    fn key(id: &str) -> NodeKey {
        NodeKey::event("t", Kind::Frame, id)
    }

    /// `facts[i]` = (own id, whether it may be direct, link targets); `spared` and `present`
    /// are target ids.
    fn direct(facts: &[(&str, bool, &[&str])], spared: &[&str], present: &[&str]) -> Vec<bool> {
        let mut candidates: HashMap<NodeKey, Option<usize>> = HashMap::default();
        for (i, (own, candidate, _)) in facts.iter().enumerate() {
            candidates
                .entry(key(own))
                .and_modify(|c| *c = None)
                .or_insert(candidate.then_some(i));
        }
        let targets: Vec<(usize, NodeKey)> = facts
            .iter()
            .enumerate()
            .flat_map(|(i, (_, _, t))| t.iter().map(move |id| (i, key(id))))
            .collect();
        let spared: Vec<(NodeKey, SparedLink<'_>)> = spared
            .iter()
            .map(|id| (key(id), ("t", NodeKind::Event(Kind::Frame), *id)))
            .collect();
        direct_facts(
            facts.len(),
            &candidates,
            &targets,
            |k| !present.iter().any(|p| key(p) == *k),
            &spared,
        )
    }

    #[test]
    fn new_events_naming_only_spared_targets_or_each_other_are_direct() {
        let got = direct(
            &[("a", true, &["x"]), ("b", true, &["a", "y"])],
            &["x", "y"],
            &[],
        );
        assert_eq!(got, [true, true]);
    }

    #[test]
    fn a_fact_that_is_not_direct_knocks_out_what_it_names_and_what_names_that() {
        // u (no request id) names a; b names a; c names b: the knock-out runs down the chain.
        let got = direct(
            &[
                ("u", false, &["a"]),
                ("a", true, &[]),
                ("b", true, &["a"]),
                ("c", true, &["b"]),
                ("d", true, &["x"]),
            ],
            &["x"],
            &[],
        );
        assert_eq!(got, [false, false, false, false, true]);
    }

    #[test]
    fn a_target_in_memory_or_needed_keeps_the_fact_in_the_graph() {
        // "m" is neither spared nor a candidate (a node in memory, or needed by the pass).
        let got = direct(&[("a", true, &["m"]), ("b", true, &[])], &[], &[]);
        assert_eq!(got, [false, true]);
    }

    #[test]
    fn an_id_two_facts_have_or_the_load_brought_in_is_not_direct() {
        let got = direct(
            &[("a", true, &[]), ("a", true, &[]), ("b", true, &[])],
            &[],
            &["b"],
        );
        assert_eq!(got, [false, false, false]);
    }
}
