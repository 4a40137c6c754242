#include "search/elimination.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <utility>

namespace loom {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Costs are added and compared, never subtracted: +infinity is safe, but NaN
// and -infinity (which meets +infinity as NaN) are not.
Status CheckCosts(const std::vector<double>& costs, int64_t columns, const std::string& what) {
  for (size_t i = 0; i < costs.size(); ++i) {
    const double c = costs[i];
    if (std::isnan(c) || c == -kInf) {
      const std::string at = columns > 0 ? StrCat("[", i / static_cast<size_t>(columns), "][",
                                                  i % static_cast<size_t>(columns), "]")
                                         : StrCat(" config ", i);
      return InvalidArgument(what, at, " costs ", c, " (costs must be numbers or +infinity)");
    }
  }
  return Status::Ok();
}

Status Validate(const CostGraph& g) {
  const int64_t n = static_cast<int64_t>(g.node_costs.size());
  for (int64_t v = 0; v < n; ++v) {
    if (g.node_costs[v].empty()) return InvalidArgument("node ", v, " has no configurations");
    LOOM_RETURN_IF_ERROR(CheckCosts(g.node_costs[v], 0, StrCat("node ", v)));
  }
  for (size_t i = 0; i < g.edges.size(); ++i) {
    const CostGraph::Edge& e = g.edges[i];
    const std::string name = StrCat("edge ", i, " (node ", e.from, " -> node ", e.to, ")");
    if (e.from < 0 || e.from >= n || e.to < 0 || e.to >= n)
      return InvalidArgument(name, " names a node outside the graph's ", n, " nodes");
    if (e.from == e.to) return InvalidArgument(name, " joins a node to itself");
    const size_t rows = g.node_costs[e.from].size(), columns = g.node_costs[e.to].size();
    if (e.costs.size() != rows * columns)
      return InvalidArgument(name, " has ", e.costs.size(), " costs, expected ", rows, " x ", columns, " = ",
                             rows * columns);
    LOOM_RETURN_IF_ERROR(CheckCosts(e.costs, static_cast<int64_t>(columns), name));
  }
  if (g.tie_group.empty()) return Status::Ok();
  if (static_cast<int64_t>(g.tie_group.size()) != n)
    return InvalidArgument("tie_group has ", g.tie_group.size(), " entries for ", n, " nodes");
  std::map<int, int64_t> first;  // tie group -> its first node
  for (int64_t v = 0; v < n; ++v) {
    const int group = g.tie_group[v];
    if (group < -1)
      return InvalidArgument("node ", v, " has tie group ", group, " (expected -1 for free, or an id >= 0)");
    if (group == -1) continue;
    const auto [it, fresh] = first.emplace(group, v);
    if (!fresh && g.node_costs[it->second].size() != g.node_costs[v].size())
      return InvalidArgument("nodes ", it->second, " and ", v, " share tie group ", group, " but have ",
                             g.node_costs[it->second].size(), " and ", g.node_costs[v].size(), " configurations");
  }
  return Status::Ok();
}

// The objective of a checked graph for a checked choice, summed in one fixed
// order (nodes, then edges) so that the solver reports exactly CostOf.
double Objective(const CostGraph& g, const std::vector<int>& choice) {
  if (!g.tie_group.empty()) {
    std::map<int, int> taken;  // tie group -> its config
    for (size_t v = 0; v < choice.size(); ++v) {
      if (g.tie_group[v] < 0) continue;
      const auto [it, fresh] = taken.emplace(g.tie_group[v], choice[v]);
      if (!fresh && it->second != choice[v]) return kInf;
    }
  }
  double total = 0;
  for (size_t v = 0; v < choice.size(); ++v) total += g.node_costs[v][choice[v]];
  for (const CostGraph::Edge& e : g.edges)
    total += e.costs[static_cast<size_t>(choice[e.from]) * g.node_costs[e.to].size() + choice[e.to]];
  return total;
}

// Whole numbers as such; a product too large for a double says so.
std::string CountText(double count) {
  if (!std::isfinite(count)) return "more than 1e308";
  return count < 1e15 ? std::to_string(static_cast<int64_t>(count)) : StrCat(count);
}

// The graph being reduced. Its nodes are the caller's nodes with each tie
// group contracted into one; at most one live edge joins any pair (a parallel
// edge is merged as it arrives: edge elimination). Eliminations are recorded
// as steps and undone in reverse order.
class Eliminator {
 public:
  int AddNode(const std::vector<double>& costs) {
    cost_.push_back(costs);
    k_.push_back(static_cast<int>(costs.size()));
    weight_.push_back(1);
    adj_.emplace_back();
    return static_cast<int>(cost_.size()) - 1;
  }

  // A tied member of node v: its costs add to v's at the same index.
  void AddMember(int v, const std::vector<double>& costs) {
    for (int c = 0; c < k_[v]; ++c) cost_[v][c] += costs[c];
    ++weight_[v];
  }

  // An edge inside a tie group: only its diagonal can ever be taken.
  void AddDiagonal(int v, const std::vector<double>& m) {
    for (int c = 0; c < k_[v]; ++c) cost_[v][c] += m[static_cast<size_t>(c) * k_[v] + c];
  }

  // `m` is row-major [config of a][config of b].
  void AddEdge(int a, int b, std::vector<double> m) {
    const auto it = adj_[a].find(b);
    if (it == adj_[a].end()) {
      const int id = static_cast<int>(edges_.size());
      edges_.push_back({a, b, std::move(m)});
      adj_[a][b] = id;
      adj_[b][a] = id;
      return;
    }
    Edge& e = edges_[it->second];
    if (e.a == a) {
      for (size_t i = 0; i < m.size(); ++i) e.m[i] += m[i];
    } else {  // stored the other way round: add the transpose
      for (int ca = 0; ca < k_[a]; ++ca)
        for (int cb = 0; cb < k_[b]; ++cb)
          e.m[static_cast<size_t>(cb) * k_[a] + ca] += m[static_cast<size_t>(ca) * k_[b] + cb];
    }
    ++edges_eliminated_;
  }

  // Applies the rules until none does. Leaves and isolated nodes go first:
  // they are cheaper (O(|C_u| |C_v|)) than node elimination (O(|C_u| |C_v|
  // |C_w|)), and a chain then unwinds from its ends without ever paying the
  // cubic cost. A node is queued whenever its degree may have dropped to 2 or
  // less, so nothing is rescanned.
  void Reduce() {
    for (int v = 0; v < static_cast<int>(cost_.size()); ++v) Touch(v);
    while (!low_.empty() || !two_.empty()) {
      std::deque<int>& queue = low_.empty() ? two_ : low_;
      const int v = queue.front();
      queue.pop_front();
      if (weight_[v] == 0) continue;  // already eliminated
      switch (adj_[v].size()) {
        case 0: EliminateIsolated(v); break;
        case 1: EliminateLeaf(v); break;
        case 2: EliminateNode(v); break;
        default: break;  // its degree rose again; queued anew if it drops
      }
    }
  }

  // Tries every joint configuration of the nodes left (in index order, each
  // node adding its own cost and its edges to earlier nodes to a running
  // prefix sum); the first minimum found wins ties.
  Status Enumerate(double max_enumeration, int64_t total_nodes) {
    std::vector<int> left;
    int64_t left_nodes = 0;
    double product = 1;
    for (int v = 0; v < static_cast<int>(cost_.size()); ++v) {
      if (weight_[v] == 0) continue;
      left.push_back(v);
      left_nodes += weight_[v];
      product *= k_[v];
    }
    if (left.empty()) return Status::Ok();
    if (product > max_enumeration)
      return FailedPrecondition(left_nodes, " of ", total_nodes,
                                " nodes remain irreducible after elimination (each joined to 3 or more others); their "
                                "configurations multiply to ", CountText(product),
                                ", more than the enumeration limit of ", CountText(max_enumeration));
    const int r = static_cast<int>(left.size());
    std::vector<int> position(cost_.size(), -1);
    for (int i = 0; i < r; ++i) position[left[i]] = i;
    // An edge from an earlier node j: its cost is m[c_j * sj + c_i * si].
    struct Link {
      int j;
      const double* m;
      size_t sj, si;
    };
    std::vector<std::vector<Link>> links(r);
    for (int i = 0; i < r; ++i) {
      for (const auto& [neighbour, id] : adj_[left[i]]) {
        const int j = position[neighbour];
        if (j >= i) continue;  // counted at the later node
        const Edge& e = edges_[id];
        if (e.a == neighbour) links[i].push_back({j, e.m.data(), static_cast<size_t>(k_[left[i]]), 1});
        else links[i].push_back({j, e.m.data(), 1, static_cast<size_t>(k_[neighbour])});
      }
    }
    std::vector<int> c(r, -1), best_c(r, 0);
    std::vector<double> prefix(r + 1, 0);
    double best = kInf;
    int i = 0;
    while (i >= 0) {
      if (++c[i] == k_[left[i]]) {
        c[i] = -1;
        --i;
        continue;
      }
      double s = prefix[i] + cost_[left[i]][c[i]];
      for (const Link& l : links[i]) s += l.m[c[l.j] * l.sj + c[i] * l.si];
      if (i + 1 < r) {
        prefix[++i] = s;
      } else if (s < best) {
        best = s;
        best_c = c;
      }
    }
    choice_.assign(cost_.size(), -1);
    for (int j = 0; j < r; ++j) choice_[left[j]] = best_c[j];
    enumerated_ = left_nodes;
    return Status::Ok();
  }

  // Every node's config: the enumerated ones are set, the eliminated ones
  // follow from their neighbours, which were eliminated later (or
  // enumerated). The argmin is found here, for the one (c_u, c_w) taken, with
  // the very sums the elimination compared, so it picks a true minimizer (the
  // lowest c_v among equals) and elimination's inner loop stays a plain min.
  std::vector<int> Undo() {
    choice_.resize(cost_.size(), -1);
    for (auto s = steps_.rbegin(); s != steps_.rend(); ++s) {
      const int v = s->v;
      if (s->u < 0) {
        choice_[v] = s->config;
        continue;
      }
      const int cu = choice_[s->u];
      double best = kInf;
      int arg = 0;
      for (int cv = 0; cv < k_[v]; ++cv) {
        double t = EdgeCost(s->uv, s->u, cu, cv) + cost_[v][cv];
        if (s->w >= 0) t += EdgeCost(s->vw, v, cv, choice_[s->w]);
        if (t < best) {
          best = t;
          arg = cv;
        }
      }
      choice_[v] = arg;
    }
    return choice_;
  }

  int64_t nodes_eliminated() const { return nodes_eliminated_; }
  int64_t edges_eliminated() const { return edges_eliminated_; }
  int64_t enumerated() const { return enumerated_; }

 private:
  struct Edge {
    int a, b;
    std::vector<double> m;  // row-major [config of a][config of b]
  };
  // An elimination, to undo: v with its config (isolated, u = w = -1), or
  // with the edges it went with (a leaf: uv to u, w = -1; a node between u and
  // w: uv and vw). v's final costs stay in cost_[v].
  struct Step {
    int v, u, w;
    int config = 0;
    Edge uv, vw;
  };

  void Touch(int v) {
    const size_t degree = adj_[v].size();
    if (degree <= 1) low_.push_back(v);
    else if (degree == 2) two_.push_back(v);
  }

  // Edge e's cost for x taking cx and its other end taking cy.
  double EdgeCost(const Edge& e, int x, int cx, int cy) const {
    return e.a == x ? e.m[static_cast<size_t>(cx) * k_[e.b] + cy] : e.m[static_cast<size_t>(cy) * k_[x] + cx];
  }

  // Drops v from the graph; its edges stay in edges_ (dead) for its step.
  void Remove(int v) {
    for (const auto& [neighbour, id] : adj_[v]) adj_[neighbour].erase(v);
    adj_[v].clear();
    nodes_eliminated_ += weight_[v];
    weight_[v] = 0;
  }

  void EliminateIsolated(int v) {
    int best = 0;
    for (int c = 1; c < k_[v]; ++c)
      if (cost_[v][c] < cost_[v][best]) best = c;
    steps_.push_back({v, -1, -1, best, {}, {}});
    Remove(v);
  }

  // node_cost[u][c_u] += min over c_v of e(u,v)[c_u][c_v] + node_cost[v][c_v],
  // reading the edge in the order it is laid out.
  void EliminateLeaf(int v) {
    const auto [u, id] = *adj_[v].begin();
    const Edge& e = edges_[id];
    const int ku = k_[u], kv = k_[v];
    const double* cv_cost = cost_[v].data();
    std::vector<double> best(ku, kInf);
    if (e.a == u) {
      for (int cu = 0; cu < ku; ++cu)
        for (int cv = 0; cv < kv; ++cv)
          best[cu] = std::min(best[cu], e.m[static_cast<size_t>(cu) * kv + cv] + cv_cost[cv]);
    } else {
      for (int cv = 0; cv < kv; ++cv)
        for (int cu = 0; cu < ku; ++cu)
          best[cu] = std::min(best[cu], e.m[static_cast<size_t>(cv) * ku + cu] + cv_cost[cv]);
    }
    for (int cu = 0; cu < ku; ++cu) cost_[u][cu] += best[cu];
    steps_.push_back({v, u, -1, 0, std::move(edges_[id]), {}});
    Remove(v);
    Touch(u);
  }

  // v between u and w becomes an edge u-w:
  //   m[c_u][c_w] = min over c_v of e(u,v)[c_u][c_v] + node_cost[v][c_v] + e(v,w)[c_v][c_w].
  void EliminateNode(int v) {
    auto it = adj_[v].begin();
    const auto [u, id_uv] = *it++;
    const auto [w, id_vw] = *it;
    const int ku = k_[u], kv = k_[v], kw = k_[w];
    // Both edges laid out in the order the inner loop reads them, v's own
    // cost folded into the first (summed as Undo sums them).
    std::vector<double> a(static_cast<size_t>(ku) * kv), b(static_cast<size_t>(kv) * kw);
    for (int cu = 0; cu < ku; ++cu)
      for (int cv = 0; cv < kv; ++cv)
        a[static_cast<size_t>(cu) * kv + cv] = EdgeCost(edges_[id_uv], u, cu, cv) + cost_[v][cv];
    for (int cv = 0; cv < kv; ++cv)
      for (int cw = 0; cw < kw; ++cw) b[static_cast<size_t>(cv) * kw + cw] = EdgeCost(edges_[id_vw], v, cv, cw);
    std::vector<double> m(static_cast<size_t>(ku) * kw, kInf);
    for (int cu = 0; cu < ku; ++cu) {
      double* row = &m[static_cast<size_t>(cu) * kw];
      for (int cv = 0; cv < kv; ++cv) {
        const double x = a[static_cast<size_t>(cu) * kv + cv];
        if (x == kInf) continue;  // cannot beat anything
        const double* brow = &b[static_cast<size_t>(cv) * kw];
        for (int cw = 0; cw < kw; ++cw) row[cw] = std::min(row[cw], x + brow[cw]);
      }
    }
    steps_.push_back({v, u, w, 0, std::move(edges_[id_uv]), std::move(edges_[id_vw])});
    Remove(v);
    AddEdge(u, w, std::move(m));
    Touch(u);
    Touch(w);
  }

  std::vector<std::vector<double>> cost_;  // node -> config -> cost, with eliminated leaves folded in
  std::vector<int> k_;                     // node -> config count
  std::vector<int64_t> weight_;            // node -> the caller's nodes it stands for; 0 once eliminated
  std::vector<std::map<int, int>> adj_;    // node -> neighbour -> live edge id
  std::vector<Edge> edges_;
  std::vector<Step> steps_;
  std::deque<int> low_, two_;  // nodes of degree <= 1, of degree 2 (as they were when queued)
  std::vector<int> choice_;
  int64_t nodes_eliminated_ = 0, edges_eliminated_ = 0, enumerated_ = 0;
};

}  // namespace

StatusOr<EliminationResult> SolveByElimination(const CostGraph& graph, double max_enumeration) {
  LOOM_RETURN_IF_ERROR(Validate(graph));
  if (!(max_enumeration >= 0)) return InvalidArgument("max_enumeration must be >= 0, got ", max_enumeration);
  const int n = static_cast<int>(graph.node_costs.size());
  // Tie groups contract into one node each: exact, since a group's members
  // share one config index, and it keeps e.g. a chain of tied blocks a chain.
  Eliminator el;
  std::vector<int> node_of(n);
  std::map<int, int> group_node;
  for (int v = 0; v < n; ++v) {
    const int group = graph.tie_group.empty() ? -1 : graph.tie_group[v];
    const auto it = group >= 0 ? group_node.find(group) : group_node.end();
    if (it != group_node.end()) {
      node_of[v] = it->second;
      el.AddMember(it->second, graph.node_costs[v]);
      continue;
    }
    node_of[v] = el.AddNode(graph.node_costs[v]);
    if (group >= 0) group_node[group] = node_of[v];
  }
  for (const CostGraph::Edge& e : graph.edges) {
    const int a = node_of[e.from], b = node_of[e.to];
    if (a == b) el.AddDiagonal(a, e.costs);
    else el.AddEdge(a, b, e.costs);
  }
  el.Reduce();
  LOOM_RETURN_IF_ERROR(el.Enumerate(max_enumeration, n));
  const std::vector<int> internal = el.Undo();
  EliminationResult result;
  result.choice.resize(n);
  for (int v = 0; v < n; ++v) result.choice[v] = internal[node_of[v]];
  result.cost = Objective(graph, result.choice);
  result.nodes_eliminated = el.nodes_eliminated();
  result.edges_eliminated = el.edges_eliminated();
  result.enumerated = el.enumerated();
  return result;
}

StatusOr<double> CostOf(const CostGraph& graph, const std::vector<int>& choice) {
  LOOM_RETURN_IF_ERROR(Validate(graph));
  if (choice.size() != graph.node_costs.size())
    return InvalidArgument("the choice has ", choice.size(), " configs for ", graph.node_costs.size(), " nodes");
  for (size_t v = 0; v < choice.size(); ++v)
    if (choice[v] < 0 || static_cast<size_t>(choice[v]) >= graph.node_costs[v].size())
      return InvalidArgument("node ", v, " takes config ", choice[v], " of ", graph.node_costs[v].size());
  return Objective(graph, choice);
}

}  // namespace loom
