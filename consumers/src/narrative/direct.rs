//! Which facts of a narrative pass are placed directly, in their own request's narrative,
//! without entering the graph (the rule is [`super::projector::Projector`]'s `load_named`).

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::graph::NodeKey;
use super::projector::SparedLink;

/// Which facts of a pass are placed directly (see `Projector::load_named`): a candidate
/// (`candidates`: own id → the one fact that has it, if it may be direct) whose own id is
/// `absent` from memory after the load, whose every target is spared or direct, and whose
/// own id no fact that is not direct names.
///
/// Knocking one fact out can knock out others: the facts it names, and the facts naming it
/// through a target that is not spared. Each fact is knocked out once and then passes the
/// knock-out along its links, so the work is linear in the links (a fixpoint over every link
/// per round took quadratic time on a chain, seconds for one pass of 10k linked frames).
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
    // Per fact: the candidates it names, and the facts that name it through a target that is
    // not spared (a fact whose own id two facts have is no candidate: nobody's target then).
    let mut names: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut named_by: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (j, k) in targets {
        match candidates.get(k).copied().flatten() {
            Some(i) => {
                names[*j].push(i);
                if !spared.contains(k) {
                    named_by[i].push(*j);
                }
            }
            // A target neither spared nor a candidate's: in memory, or needed by the pass.
            None if !spared.contains(k) => direct[*j] = false,
            None => {}
        }
    }
    let mut out: Vec<usize> = (0..n).filter(|&x| !direct[x]).collect();
    while let Some(x) = out.pop() {
        for &i in names[x].iter().chain(&named_by[x]) {
            if direct[i] {
                direct[i] = false;
                out.push(i);
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
    fn a_knock_out_runs_down_a_long_chain() {
        // f0 <- f1 <- ... <- f9999 (each names the one before), and f0 names "m" (in memory):
        // f0 is out, so is every fact naming it, link by link; g1 -> g0 -> spared x stay.
        let ids: Vec<String> = (0..10_000).map(|i| format!("f{i}")).collect();
        let mut facts: Vec<(&str, bool, Vec<&str>)> = vec![(ids[0].as_str(), true, vec!["m"])];
        for i in 1..ids.len() {
            facts.push((ids[i].as_str(), true, vec![ids[i - 1].as_str()]));
        }
        facts.push(("g0", true, vec!["x"]));
        facts.push(("g1", true, vec!["g0"]));
        let refs: Vec<(&str, bool, &[&str])> = facts
            .iter()
            .map(|(o, c, t)| (*o, *c, t.as_slice()))
            .collect();
        let got = direct(&refs, &["x"], &[]);
        assert!(got[..10_000].iter().all(|d| !d));
        assert_eq!(&got[10_000..], [true, true]);
    }

    #[test]
    fn a_fact_naming_a_knocked_out_one_through_a_spared_id_stays() {
        // u (no request id) names g0, so g0 is out; h names g0 too, but g0 is also a spared
        // id, so h does not depend on g0's placement.
        let got = direct(
            &[
                ("g0", true, &["x"]),
                ("h", true, &["g0"]),
                ("u", false, &["g0"]),
            ],
            &["x", "g0"],
            &[],
        );
        assert_eq!(got, [false, true, false]);
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
