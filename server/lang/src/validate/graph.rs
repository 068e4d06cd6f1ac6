//! Cycles and the `each` rule, over the reference graph.
//!
//! Cycles are found with Tarjan's strongly connected components (iterative,
//! so a 10,000-long chain cannot overflow the stack), one report per
//! component, naming its members in cycle order starting from the one
//! declared first. Same input, same report, byte for byte.

use super::refs::{Graph, NodeRef, describe, name_span};
use crate::blueprint::Blueprint;
use crate::diag::{Diagnostic, Diagnostics, codes};

/// Strongly connected components, each sorted by declaration order; the
/// list itself is ordered by each component's first member.
pub(super) fn strongly_connected(edges: &[Vec<(usize, crate::source::Span)>]) -> Vec<Vec<usize>> {
    let n = edges.len();
    const UNSET: usize = usize::MAX;
    let mut index = vec![UNSET; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut out = Vec::new();
    let mut counter = 0;
    // (node, next edge position) frames replace recursion.
    let mut frames: Vec<(usize, usize)> = Vec::new();
    for root in 0..n {
        if index[root] != UNSET {
            continue;
        }
        frames.push((root, 0));
        index[root] = counter;
        low[root] = counter;
        counter += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut pos)) = frames.last_mut() {
            if let Some(&(w, _)) = edges[v].get(*pos) {
                *pos += 1;
                if index[w] == UNSET {
                    index[w] = counter;
                    low[w] = counter;
                    counter += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    frames.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            frames.pop();
            if let Some(&(parent, _)) = frames.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                comp.sort_unstable();
                out.push(comp);
            }
        }
    }
    out.sort_by_key(|c| c[0]);
    out
}

/// One cycle through `start` inside `members`, following edges in the order
/// they were written; returns the nodes in order (without repeating start).
fn cycle_through(
    start: usize,
    members: &[usize],
    edges: &[Vec<(usize, crate::source::Span)>],
) -> Vec<usize> {
    let inside = |x: usize| members.binary_search(&x).is_ok();
    let mut path = vec![start];
    let mut visited = vec![false; edges.len()];
    visited[start] = true;
    let mut positions = vec![0usize];
    while let Some(&v) = path.last() {
        let pos = positions.last_mut().expect("parallel stacks");
        let next = edges[v][*pos..].iter().position(|&(w, _)| inside(w));
        match next {
            Some(offset) => {
                let (w, _) = edges[v][*pos + offset];
                *pos += offset + 1;
                if w == start {
                    return path;
                }
                if !visited[w] {
                    visited[w] = true;
                    path.push(w);
                    positions.push(0);
                }
            }
            None => {
                path.pop();
                positions.pop();
            }
        }
    }
    vec![start]
}

pub(super) fn report_cycles(bp: &Blueprint, graph: &Graph, diags: &mut Diagnostics) {
    for comp in strongly_connected(&graph.edges) {
        let first = comp[0];
        let self_loop = graph.edges[first].iter().any(|(w, _)| *w == first);
        if comp.len() == 1 && !self_loop {
            continue;
        }
        let cycle = cycle_through(first, &comp, &graph.edges);
        let names: Vec<String> = cycle
            .iter()
            .map(|&i| describe(bp, graph.nodes[i]))
            .collect();
        let mut message = if cycle.len() == 1 {
            format!("{} references itself", names[0])
        } else {
            format!("reference cycle: {} -> {}", names.join(" -> "), names[0])
        };
        let others: Vec<String> = comp
            .iter()
            .filter(|i| !cycle.contains(i))
            .map(|&i| describe(bp, graph.nodes[i]))
            .collect();
        if !others.is_empty() {
            message.push_str(&format!(" (also in this cycle: {})", others.join(", ")));
        }
        // Point at the reference that closes the loop back to the first member.
        let last = *cycle.last().expect("non-empty cycle");
        let span = graph.edges[last]
            .iter()
            .find(|(w, _)| *w == first)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| name_span(bp, graph.nodes[first]));
        diags.push(
            Diagnostic::new(&codes::REFERENCE_CYCLE, span, message)
                .with_hint("break the cycle: one of these must not depend on the other"),
        );
    }
}

/// `each` is expanded before anything is deployed, so it may not depend on a
/// resource or a child blueprint, directly or through values/data sources.
pub(super) fn check_each_sources(bp: &Blueprint, graph: &Graph, diags: &mut Diagnostics) {
    for (res, targets) in &graph.each_targets {
        let mut seen = vec![false; graph.nodes.len()];
        // Breadth-first, remembering how each node was reached.
        let mut queue: std::collections::VecDeque<(usize, usize, crate::source::Span)> =
            targets.iter().map(|&(t, s)| (t, usize::MAX, s)).collect();
        let mut via: Vec<usize> = vec![usize::MAX; graph.nodes.len()];
        while let Some((v, from, span)) = queue.pop_front() {
            if seen[v] {
                continue;
            }
            seen[v] = true;
            via[v] = from;
            if matches!(graph.nodes[v], NodeRef::Resource(_) | NodeRef::Child(_)) {
                let mut chain = vec![describe(bp, graph.nodes[v])];
                let mut cur = via[v];
                while cur != usize::MAX {
                    chain.push(describe(bp, graph.nodes[cur]));
                    cur = via[cur];
                }
                chain.reverse();
                let name = &bp.resources[*res].name.value;
                let root_span = targets
                    .iter()
                    .find(|(t, _)| describe(bp, graph.nodes[*t]) == chain[0])
                    .map(|(_, s)| *s)
                    .unwrap_or(span);
                diags.push(
                    Diagnostic::new(
                        &codes::EACH_DEPENDS_ON_RESOURCE,
                        root_span,
                        if chain.len() == 1 {
                            format!("`each` of resource `{name}` depends on {}", chain[0])
                        } else {
                            format!(
                                "`each` of resource `{name}` depends on {}: {}",
                                describe(bp, graph.nodes[v]),
                                chain.join(" -> ")
                            )
                        },
                    )
                    .with_hint("`each` is expanded before deployment; derive it from variables, values or data sources only"),
                );
                break;
            }
            for &(w, s) in &graph.edges[v] {
                if !seen[w] {
                    queue.push_back((w, v, s));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Span;

    fn edges(list: &[&[usize]]) -> Vec<Vec<(usize, Span)>> {
        list.iter()
            .map(|e| e.iter().map(|&w| (w, Span::default())).collect())
            .collect()
    }

    #[test]
    fn components_are_deterministic() {
        // 0 -> 1 -> 2 -> 0, 3 -> 3, 4 alone, 5 <-> 6
        let g = edges(&[&[1], &[2], &[0], &[3], &[], &[6], &[5]]);
        let comps = strongly_connected(&g);
        assert_eq!(comps, vec![vec![0, 1, 2], vec![3], vec![4], vec![5, 6]]);
        assert_eq!(cycle_through(0, &[0, 1, 2], &g), vec![0, 1, 2]);
    }

    #[test]
    fn long_chains_do_not_overflow() {
        let n = 200_000;
        let g: Vec<Vec<(usize, Span)>> = (0..n)
            .map(|i| vec![((i + 1) % n, Span::default())])
            .collect();
        let comps = strongly_connected(&g);
        assert_eq!(comps.len(), 1);
        assert_eq!(cycle_through(0, &comps[0], &g).len(), n);
    }
}
