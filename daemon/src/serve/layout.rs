//! Where the status page draws each resource: a layered layout of the graph, providers left of
//! the resources that depend on them. Pure.
//!
//! A node's layer is the longest path to it from a resource that depends on nothing (found in
//! petgraph's topological order). An edge that spans several layers gets a waypoint in each
//! layer it crosses, which takes a place in that layer like a node, so long edges run between
//! boxes instead of through them. Within a layer, nodes and waypoints are ordered by a few
//! barycenter sweeps (each moves towards the mean height of its neighbours in the next layer),
//! which removes most crossings. A layer taller than a screen (200 workloads of one database)
//! wraps into columns side by side, the next layer starting right of them. Edges of a cycle
//! (state never records one, but a damaged file might) are dropped for the layering by
//! petgraph's greedy feedback arc set, so the layout always places every node.

use daggy::petgraph::algo::{greedy_feedback_arc_set, toposort};
use daggy::petgraph::graph::{DiGraph, NodeIndex};
use daggy::petgraph::visit::EdgeRef;

/// A node's box, in the page's units (CSS pixels at zoom 1).
pub const NODE_WIDTH: f64 = 180.0;
pub const NODE_HEIGHT: f64 = 36.0;
/// From one layer's centre line to the next: room for the edges between them.
const LAYER_GAP: f64 = 250.0;
/// From one node's centre to the next in a layer.
const ROW_GAP: f64 = 48.0;
/// The most slots one column of a layer holds; a layer with more wraps into more columns.
const MAX_ROWS: usize = 24;
/// Between the columns of a wrapped layer: room for the edges that pass between them.
const COLUMN_GAP: f64 = 40.0;
/// Down and up sweeps of the barycenter ordering: more give little once crossings settle.
const SWEEPS: usize = 4;
/// Waypoints are given up beyond this many (edges past it are drawn straight): a graph of a
/// few thousand nodes needs far fewer, and it bounds the work a strange one can cause.
const MAX_WAYPOINTS: usize = 100_000;

/// Where one node goes: its layer and rank in it, and its centre.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed {
    pub layer: usize,
    pub rank: usize,
    pub x: f64,
    pub y: f64,
}

/// The layout of a graph: one [`Placed`] per node in the nodes' order, the waypoints of each
/// edge in the edges' order (the centres of the slots it runs through, from the consumer to
/// the provider; none for an edge between neighbouring layers), and the size of the drawing
/// (every box and waypoint lies within `0..width` × `0..height`).
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub nodes: Vec<Placed>,
    pub waypoints: Vec<Vec<(f64, f64)>>,
    pub width: f64,
    pub height: f64,
}

/// Lays out `count` nodes with `edges` given as `(consumer, provider)` indices: each provider
/// lands in a layer left of its consumers. Indices out of range and self-loops are ignored (and
/// get no waypoints). The nodes' order is the starting order within each layer, so callers
/// pass a meaningful one (by app, type, id).
pub fn layered(count: usize, edges: &[(usize, usize)]) -> Layout {
    let layer_of = layers(count, edges);
    // Slots: the nodes, then the waypoints. `next[s]` are the slots one layer right of `s`
    // it is joined to, `prev[s]` those one layer left.
    let mut slot_layer = layer_of.clone();
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); count];
    let mut prev: Vec<Vec<usize>> = vec![Vec::new(); count];
    let mut routes: Vec<Vec<usize>> = Vec::with_capacity(edges.len());
    for &(consumer, provider) in edges {
        let mut route = Vec::new();
        if consumer < count && provider < count && consumer != provider {
            let (from, to) = (layer_of[provider], layer_of[consumer]);
            // An edge the cycle breaking dropped runs right to left: joined directly.
            let span = to.saturating_sub(from);
            let mut left = provider;
            if span > 1 && slot_layer.len() + span - 1 <= count + MAX_WAYPOINTS {
                for layer in from + 1..to {
                    let slot = slot_layer.len();
                    slot_layer.push(layer);
                    next.push(Vec::new());
                    prev.push(Vec::new());
                    next[left].push(slot);
                    prev[slot].push(left);
                    route.push(slot);
                    left = slot;
                }
            }
            if span >= 1 {
                next[left].push(consumer);
                prev[consumer].push(left);
            }
            route.reverse();
        }
        routes.push(route);
    }

    let depth = slot_layer.iter().copied().max().map_or(0, |l| l + 1);
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); depth];
    for (slot, &layer) in slot_layer.iter().enumerate() {
        rows[layer].push(slot);
    }
    let mut height = vec![0.0; slot_layer.len()];
    for row in &rows {
        let middle = (row.len() as f64 - 1.0) / 2.0;
        for (rank, &slot) in row.iter().enumerate() {
            height[slot] = rank as f64 - middle;
        }
    }
    for _ in 0..SWEEPS {
        for row in rows.iter_mut().skip(1) {
            order_by_barycenter(row, &prev, &mut height);
        }
        for row in rows.iter_mut().rev().skip(1) {
            order_by_barycenter(row, &next, &mut height);
        }
    }

    // A layer of more than `MAX_ROWS` slots is wrapped into columns side by side, each as
    // tall as the others, so 200 resources of one layer are a block, not a column 200 high.
    let columns: Vec<usize> = rows
        .iter()
        .map(|r| r.len().div_ceil(MAX_ROWS).max(1))
        .collect();
    let per_column: Vec<usize> = rows
        .iter()
        .zip(&columns)
        .map(|(r, &c)| r.len().div_ceil(c))
        .collect();
    let tallest = per_column.iter().copied().max().unwrap_or(0);
    let middle = (tallest as f64 - 1.0).max(0.0) / 2.0;
    // Each layer's left edge: the layers left of it, their columns and the gaps between.
    let mut left = Vec::with_capacity(depth);
    let mut next_left = 0.0;
    for &c in &columns {
        left.push(next_left);
        next_left += c as f64 * NODE_WIDTH + (c - 1) as f64 * COLUMN_GAP + (LAYER_GAP - NODE_WIDTH);
    }
    let mut placed = vec![
        Placed {
            layer: 0,
            rank: 0,
            x: 0.0,
            y: 0.0
        };
        slot_layer.len()
    ];
    for (layer, row) in rows.iter().enumerate() {
        let high = per_column[layer];
        for (rank, &slot) in row.iter().enumerate() {
            let (column, place) = (rank / high, rank % high);
            // The last column may be shorter: centred like the others.
            let here = high.min(row.len() - column * high);
            let offset = (here as f64 - 1.0) / 2.0;
            placed[slot] = Placed {
                layer,
                rank,
                x: left[layer] + NODE_WIDTH / 2.0 + column as f64 * (NODE_WIDTH + COLUMN_GAP),
                y: NODE_HEIGHT / 2.0 + (middle + place as f64 - offset) * ROW_GAP,
            };
        }
    }
    let waypoints = routes
        .iter()
        .map(|route| {
            route
                .iter()
                .map(|&slot| (placed[slot].x, placed[slot].y))
                .collect()
        })
        .collect();
    placed.truncate(count);
    Layout {
        nodes: placed,
        waypoints,
        width: if depth == 0 {
            0.0
        } else {
            next_left - (LAYER_GAP - NODE_WIDTH)
        },
        height: if tallest == 0 {
            0.0
        } else {
            NODE_HEIGHT + (tallest - 1) as f64 * ROW_GAP
        },
    }
}

/// Each node's layer: 0 for a node that depends on nothing, else one more than its deepest
/// provider's.
fn layers(count: usize, edges: &[(usize, usize)]) -> Vec<usize> {
    let mut graph: DiGraph<(), ()> = DiGraph::with_capacity(count, edges.len());
    for _ in 0..count {
        graph.add_node(());
    }
    for &(consumer, provider) in edges {
        if consumer < count && provider < count && consumer != provider {
            // Provider → consumer: the topological order then lists providers first.
            graph.add_edge(NodeIndex::new(provider), NodeIndex::new(consumer), ());
        }
    }
    let order = match toposort(&graph, None) {
        Ok(order) => order,
        Err(_) => {
            let mut cut: Vec<_> = greedy_feedback_arc_set(&graph).map(|e| e.id()).collect();
            // Removing an edge moves the last one into its slot: highest indices first.
            cut.sort_unstable_by(|a, b| b.cmp(a));
            for edge in cut {
                graph.remove_edge(edge);
            }
            // The feedback arc set leaves the graph acyclic; should it not, every node stays
            // in the first layer rather than the page failing.
            toposort(&graph, None).unwrap_or_default()
        }
    };
    let mut layer = vec![0; count];
    for node in order {
        let next = layer[node.index()] + 1;
        for consumer in graph.neighbors(node) {
            if layer[consumer.index()] < next {
                layer[consumer.index()] = next;
            }
        }
    }
    layer
}

/// Orders `row` by the mean height of each slot's `neighbours` (one without any keeps its own
/// height), then gives the row's slots their new heights.
fn order_by_barycenter(row: &mut [usize], neighbours: &[Vec<usize>], height: &mut [f64]) {
    let mut keyed: Vec<(f64, usize)> = row
        .iter()
        .map(|&slot| {
            let around = &neighbours[slot];
            let key = if around.is_empty() {
                height[slot]
            } else {
                around.iter().map(|&n| height[n]).sum::<f64>() / around.len() as f64
            };
            (key, slot)
        })
        .collect();
    // Stable: ties keep the order they had, so sweeps converge instead of flipping.
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let middle = (row.len() as f64 - 1.0) / 2.0;
    for (rank, (place, (_, slot))) in row.iter_mut().zip(keyed).enumerate() {
        *place = slot;
        height[slot] = rank as f64 - middle;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// The segments each edge is drawn as, between neighbouring layers: `(left, right)` ends.
    fn segments(layout: &Layout, edges: &[(usize, usize)]) -> Vec<((f64, f64), (f64, f64))> {
        let mut out = Vec::new();
        for (i, &(consumer, provider)) in edges.iter().enumerate() {
            let c = layout.nodes[consumer];
            let p = layout.nodes[provider];
            let mut points = vec![(c.x, c.y)];
            points.extend(&layout.waypoints[i]);
            points.push((p.x, p.y));
            for pair in points.windows(2) {
                out.push((pair[1], pair[0]));
            }
        }
        out
    }

    /// Pairs of segments between the same two layers that cross.
    fn crossings(layout: &Layout, edges: &[(usize, usize)]) -> usize {
        let all = segments(layout, edges);
        let mut n = 0;
        for (i, &(a1, a2)) in all.iter().enumerate() {
            for &(b1, b2) in &all[i + 1..] {
                if a1.0 == b1.0 && a2.0 == b2.0 && (a1.1 - b1.1) * (a2.1 - b2.1) < 0.0 {
                    n += 1;
                }
            }
        }
        n
    }

    #[test]
    fn providers_sit_left_of_their_consumers_at_the_longest_path() {
        // 0 ← 1 ← 2 and 0 ← 2: 2 is two layers from 0, not one.
        let edges = [(1, 0), (2, 1), (2, 0), (3, 0)];
        let layout = layered(4, &edges);
        let layers: Vec<usize> = layout.nodes.iter().map(|p| p.layer).collect();
        assert_eq!(layers, [0, 1, 2, 1]);
        for &(consumer, provider) in &edges {
            assert!(layout.nodes[provider].x < layout.nodes[consumer].x);
        }
    }

    #[test]
    fn a_long_edge_runs_through_a_free_slot_of_each_layer_it_crosses() {
        // 3 → 2 → 1 → 0, and 3 → 0 across two layers.
        let edges = [(1, 0), (2, 1), (3, 2), (3, 0)];
        let layout = layered(4, &edges);
        assert!(layout.waypoints[..3].iter().all(Vec::is_empty));
        let route = &layout.waypoints[3];
        assert_eq!(route.len(), 2);
        // From the consumer towards the provider: right to left, one per layer.
        assert_eq!(route[0].0, layout.nodes[2].x);
        assert_eq!(route[1].0, layout.nodes[1].x);
        for (i, &(x, y)) in route.iter().enumerate() {
            let node = layout.nodes[2 - i];
            assert!(x == node.x && (y - node.y).abs() >= ROW_GAP, "{layout:?}");
            assert!(y + NODE_HEIGHT / 2.0 <= layout.height);
        }
    }

    #[test]
    fn boxes_never_overlap_and_fit_the_drawing() {
        let edges: Vec<(usize, usize)> = (1..40).map(|i| (i, i / 3)).chain([(39, 0)]).collect();
        let layout = layered(40, &edges);
        for (i, a) in layout.nodes.iter().enumerate() {
            assert!(a.x - NODE_WIDTH / 2.0 >= 0.0 && a.x + NODE_WIDTH / 2.0 <= layout.width);
            assert!(a.y - NODE_HEIGHT / 2.0 >= 0.0 && a.y + NODE_HEIGHT / 2.0 <= layout.height);
            for b in &layout.nodes[i + 1..] {
                let apart = (a.x - b.x).abs() >= NODE_WIDTH || (a.y - b.y).abs() >= NODE_HEIGHT;
                assert!(apart, "{a:?} overlaps {b:?}");
            }
            for &(x, y) in layout.waypoints.iter().flatten() {
                assert!((a.x - x).abs() >= NODE_WIDTH || (a.y - y).abs() >= NODE_HEIGHT);
            }
        }
    }

    #[test]
    fn sweeps_uncross_edges_the_input_order_crosses() {
        // Providers 0 and 1; consumers 2 (of 1) and 3 (of 0), given in crossing order, then
        // 4 and 5 to the right of them the same way, and 5 also reads 1 directly.
        let edges = [(2, 1), (3, 0), (4, 3), (5, 2), (5, 1)];
        let layout = layered(6, &edges);
        assert_eq!(crossings(&layout, &edges), 0, "{layout:?}");
    }

    #[test]
    fn a_wide_layer_wraps_into_columns_left_of_the_next_layer() {
        // 200 consumers of one provider, and one resource reading one of them.
        let mut edges: Vec<(usize, usize)> = (1..=200).map(|i| (i, 0)).collect();
        edges.push((201, 7));
        let layout = layered(202, &edges);
        let consumers = &layout.nodes[1..=200];
        let columns: std::collections::BTreeSet<u64> =
            consumers.iter().map(|p| p.x.to_bits()).collect();
        assert_eq!(columns.len(), 200usize.div_ceil(MAX_ROWS), "{layout:?}");
        assert!(layout.height <= NODE_HEIGHT + (MAX_ROWS - 1) as f64 * ROW_GAP);
        let rightmost = consumers.iter().map(|p| p.x).fold(0.0, f64::max);
        assert!(consumers.iter().all(|p| p.x > layout.nodes[0].x));
        assert!(
            layout.nodes[201].x > rightmost,
            "the next layer starts after the block"
        );
        for (i, a) in layout.nodes.iter().enumerate() {
            assert!(a.x + NODE_WIDTH / 2.0 <= layout.width);
            assert!(a.y - NODE_HEIGHT / 2.0 >= 0.0 && a.y + NODE_HEIGHT / 2.0 <= layout.height);
            for b in &layout.nodes[i + 1..] {
                let apart = (a.x - b.x).abs() >= NODE_WIDTH || (a.y - b.y).abs() >= NODE_HEIGHT;
                assert!(apart, "{a:?} overlaps {b:?}");
            }
        }
    }

    #[test]
    fn a_cycle_still_places_every_node() {
        let edges = [(0, 1), (1, 2), (2, 0), (3, 3), (9, 0)];
        let layout = layered(4, &edges);
        assert_eq!(layout.nodes.len(), 4);
        assert_eq!(layout.waypoints.len(), edges.len());
        let mut seen: Vec<(usize, usize)> =
            layout.nodes.iter().map(|p| (p.layer, p.rank)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 4, "two nodes share a place: {layout:?}");
    }

    #[test]
    fn an_empty_graph_is_an_empty_drawing() {
        let layout = layered(0, &[]);
        assert!(layout.nodes.is_empty());
        assert_eq!((layout.width, layout.height), (0.0, 0.0));
    }

    /// An estate of apps of five resources (the shape `cargo bench --bench scale` uses: a
    /// base-env, a postgres, a redis and a dns reading it, and the workload using all three).
    fn estate(apps: usize) -> (usize, Vec<(usize, usize)>) {
        let mut edges = Vec::new();
        for app in 0..apps {
            let [base, pg, redis, dns, workload] = [0, 1, 2, 3, 4].map(|i| app * 5 + i);
            edges.extend([
                (pg, base),
                (workload, pg),
                (workload, redis),
                (workload, dns),
            ]);
            edges.extend([(dns, base), (redis, base), (workload, base)]);
        }
        (apps * 5, edges)
    }

    #[test]
    fn five_thousand_nodes_are_laid_out_quickly() {
        let (count, edges) = estate(1_000);
        let started = Instant::now();
        let layout = layered(count, &edges);
        let took = started.elapsed();
        println!(
            "layout of {count} nodes and {} edges: {:.1} ms",
            edges.len(),
            took.as_secs_f64() * 1000.0
        );
        assert_eq!(layout.nodes.len(), count);
        let (_, few) = estate(20);
        assert_eq!(crossings(&layered(100, &few), &few), 0);
        // Unoptimised test builds are several times slower than the daemon's release build.
        let budget = if cfg!(debug_assertions) { 1_000 } else { 100 };
        assert!(took.as_millis() < budget, "{took:?}");
    }
}
