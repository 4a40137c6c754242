#include "search/elimination.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace loom {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// n nodes of min_k..max_k configs each, costs in [0, 10).
CostGraph RandomNodes(std::mt19937& rng, int n, int min_k, int max_k) {
  std::uniform_int_distribution<int> k(min_k, max_k);
  std::uniform_real_distribution<double> cost(0, 10);
  CostGraph g;
  for (int v = 0; v < n; ++v) {
    g.node_costs.emplace_back(k(rng));
    for (double& c : g.node_costs.back()) c = cost(rng);
  }
  return g;
}

// An edge between a and b, laid out either way round at random.
void AddRandomEdge(CostGraph& g, std::mt19937& rng, int a, int b) {
  if (rng() % 2) std::swap(a, b);
  std::uniform_real_distribution<double> cost(0, 10);
  CostGraph::Edge e;
  e.from = a;
  e.to = b;
  e.costs.resize(g.node_costs[a].size() * g.node_costs[b].size());
  for (double& c : e.costs) c = cost(rng);
  g.edges.push_back(std::move(e));
}

// The objective written out independently of the solver's; a choice that
// breaks a tie is skipped by the brute force below.
double Sum(const CostGraph& g, const std::vector<int>& c) {
  double total = 0;
  for (size_t v = 0; v < c.size(); ++v) total += g.node_costs[v][c[v]];
  for (const CostGraph::Edge& e : g.edges) total += e.costs[c[e.from] * g.node_costs[e.to].size() + c[e.to]];
  return total;
}

bool Tied(const CostGraph& g, const std::vector<int>& c) {
  for (size_t v = 0; v < g.tie_group.size(); ++v)
    for (size_t u = 0; u < v; ++u)
      if (g.tie_group[v] >= 0 && g.tie_group[u] == g.tie_group[v] && c[u] != c[v]) return false;
  return true;
}

// The minimum over every choice that keeps the ties.
double BruteForce(const CostGraph& g) {
  const size_t n = g.node_costs.size();
  std::vector<int> c(n, 0);
  double best = kInf;
  while (true) {
    if (Tied(g, c)) best = std::min(best, Sum(g, c));
    size_t v = 0;
    while (v < n && ++c[v] == static_cast<int>(g.node_costs[v].size())) c[v++] = 0;
    if (v == n) return best;
  }
}

bool Close(double a, double b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)});
}

// Solves g and checks it against brute force; `reducible`: no enumeration.
EliminationResult CheckAgainstBruteForce(const CostGraph& g, bool reducible) {
  auto r = SolveByElimination(g);
  if (!r.ok()) FAIL(r.status().ToString());
  const int64_t n = static_cast<int64_t>(g.node_costs.size());
  REQUIRE(r->choice.size() == g.node_costs.size());
  const double best = BruteForce(g);
  INFO("brute force " << best << ", solver " << r->cost);
  CHECK(Close(r->cost, best));
  auto cost = CostOf(g, r->choice);
  REQUIRE(cost.ok());
  CHECK(*cost == r->cost);
  CHECK(!std::isnan(r->cost));
  CHECK(Tied(g, r->choice));
  CHECK(r->nodes_eliminated + r->enumerated == n);
  if (reducible) {
    CHECK(r->enumerated == 0);
    CHECK(r->nodes_eliminated == n);
  }
  return *r;
}

// The graph families the rules reduce fully, each with random costs.
enum class Family { kChain, kTree, kDiamond, kResidual, kSkipEveryNode, kParallel };

TEST_CASE("elimination matches brute force on graphs the rules reduce") {
  std::mt19937 rng(20180715);
  std::uniform_int_distribution<int> nodes(1, 6);
  const std::map<Family, std::string> families = {
      {Family::kChain, "chain"},
      {Family::kTree, "tree"},
      {Family::kDiamond, "diamond with a tail"},
      {Family::kResidual, "residual blocks: a chain with a skip edge over every 2 nodes"},
      {Family::kSkipEveryNode, "a chain with skip edges from every node to the one after next"},
      {Family::kParallel, "parallel edges in mixed orientations"},
  };
  for (int trial = 0; trial < 200; ++trial) {
    for (const auto& [family, name] : families) {
      const int n = family == Family::kDiamond ? std::max(4, nodes(rng)) : nodes(rng);
      INFO(name << ", trial " << trial << ", " << n << " nodes");
      CostGraph g = RandomNodes(rng, n, 2, 5);
      int64_t duplicates = 0;
      switch (family) {
        case Family::kChain:
          for (int v = 0; v + 1 < n; ++v) AddRandomEdge(g, rng, v, v + 1);
          break;
        case Family::kTree:
          for (int v = 1; v < n; ++v) AddRandomEdge(g, rng, static_cast<int>(rng() % v), v);
          break;
        case Family::kDiamond:
          AddRandomEdge(g, rng, 0, 1);
          AddRandomEdge(g, rng, 0, 2);
          AddRandomEdge(g, rng, 1, 3);
          AddRandomEdge(g, rng, 2, 3);
          for (int v = 4; v < n; ++v) AddRandomEdge(g, rng, v - 1, v);
          break;
        case Family::kResidual:
          for (int v = 0; v + 1 < n; ++v) AddRandomEdge(g, rng, v, v + 1);
          for (int v = 0; v + 3 < n; v += 3) AddRandomEdge(g, rng, v, v + 3);
          break;
        case Family::kSkipEveryNode:
          for (int v = 0; v + 1 < n; ++v) AddRandomEdge(g, rng, v, v + 1);
          for (int v = 0; v + 2 < n; ++v) AddRandomEdge(g, rng, v, v + 2);
          break;
        case Family::kParallel:
          for (int v = 0; v + 1 < n; ++v) {
            AddRandomEdge(g, rng, v, v + 1);
            for (int extra = static_cast<int>(rng() % 3); extra > 0; --extra, ++duplicates)
              AddRandomEdge(g, rng, v, v + 1);
          }
          break;
      }
      const EliminationResult r = CheckAgainstBruteForce(g, true);
      // A chain's leaves never make new parallel edges: only the given ones merge.
      if (family == Family::kParallel) CHECK(r.edges_eliminated == duplicates);
    }
  }
}

TEST_CASE("elimination then enumeration matches brute force on random graphs") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> nodes(1, 6);
  int64_t enumerated = 0;
  for (int trial = 0; trial < 300; ++trial) {
    INFO("trial " << trial);
    const int n = nodes(rng);
    CostGraph g = RandomNodes(rng, n, 2, 4);
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        if (rng() % 3 != 0) AddRandomEdge(g, rng, a, b);
    enumerated += CheckAgainstBruteForce(g, false).enumerated;
  }
  CHECK(enumerated > 0);  // some graphs needed enumeration
}

// K4 (every pair joined): no node has fewer than 3 neighbours.
CostGraph K4(std::mt19937& rng) {
  CostGraph g = RandomNodes(rng, 4, 3, 3);
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) AddRandomEdge(g, rng, a, b);
  return g;
}

TEST_CASE("graphs the rules cannot reduce are enumerated under the limit") {
  std::mt19937 rng(3);
  SECTION("K4") {
    const EliminationResult r = CheckAgainstBruteForce(K4(rng), false);
    CHECK(r.enumerated == 4);
    CHECK(r.nodes_eliminated == 0);
  }
  SECTION("K4 with a chain hanging off it") {
    CostGraph g = K4(rng);
    g.node_costs.push_back({1.0, 2.0});
    g.node_costs.push_back({3.0, 0.5, 2.0});
    AddRandomEdge(g, rng, 0, 4);
    AddRandomEdge(g, rng, 4, 5);
    const EliminationResult r = CheckAgainstBruteForce(g, false);
    CHECK(r.enumerated == 4);
    CHECK(r.nodes_eliminated == 2);
  }
  SECTION("3x3 grid: the corners go, a wheel of 5 remains") {
    CostGraph g = RandomNodes(rng, 9, 3, 3);
    for (int row = 0; row < 3; ++row)
      for (int col = 0; col < 3; ++col) {
        if (col + 1 < 3) AddRandomEdge(g, rng, row * 3 + col, row * 3 + col + 1);
        if (row + 1 < 3) AddRandomEdge(g, rng, row * 3 + col, row * 3 + col + 3);
      }
    const EliminationResult r = CheckAgainstBruteForce(g, false);
    CHECK(r.nodes_eliminated == 4);
    CHECK(r.enumerated == 5);
  }
  SECTION("over the limit: an error saying what remains") {
    const CostGraph g = K4(rng);
    auto r = SolveByElimination(g, 80);  // 3^4 = 81 joint configurations
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK(r.status().message() ==
          "4 of 4 nodes remain irreducible after elimination (each joined to 3 or more others); their "
          "configurations multiply to 81, more than the enumeration limit of 80");
    CHECK(SolveByElimination(g, 81).ok());
  }
}

TEST_CASE("an empty graph costs nothing") {
  auto r = SolveByElimination(CostGraph{});
  REQUIRE(r.ok());
  CHECK(r->choice.empty());
  CHECK(r->cost == 0.0);
}

TEST_CASE("equal costs: the lower config index wins") {
  CostGraph g;
  g.node_costs.assign(6, std::vector<double>(3, 0.0));
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) g.edges.push_back({b, a, std::vector<double>(9, 1.0)});
  g.edges.push_back({4, 0, std::vector<double>(9, 1.0)});
  g.edges.push_back({4, 5, std::vector<double>(9, 1.0)});
  auto r = SolveByElimination(g);
  REQUIRE(r.ok());
  CHECK(r->choice == std::vector<int>(6, 0));
  CHECK(r->cost == 8.0);
}

TEST_CASE("infinite costs are never chosen when a finite choice exists") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> nodes(2, 6);
  int feasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    INFO("trial " << trial);
    const int n = nodes(rng);
    CostGraph g = RandomNodes(rng, n, 2, 5);
    for (int v = 1; v < n; ++v) AddRandomEdge(g, rng, static_cast<int>(rng() % v), v);
    if (trial % 2) AddRandomEdge(g, rng, 0, n - 1);  // a cycle, or a parallel edge when n = 2
    for (auto& costs : g.node_costs)
      for (double& c : costs)
        if (rng() % 3 == 0) c = kInf;
    for (auto& e : g.edges)
      for (double& c : e.costs)
        if (rng() % 4 == 0) c = kInf;
    const EliminationResult r = CheckAgainstBruteForce(g, false);
    if (std::isinf(r.cost)) continue;
    ++feasible;
    for (int v = 0; v < n; ++v) CHECK(std::isfinite(g.node_costs[v][r.choice[v]]));
  }
  CHECK(feasible > 50);
}

TEST_CASE("infinite costs: the cheapest-looking config is impossible") {
  CostGraph g;
  g.node_costs = {{kInf, 5.0, 7.0}, {0.0, 1.0}, {kInf, kInf, 2.0}};
  g.edges.push_back({0, 1, {0.0, 0.0, kInf, 0.0, 0.0, 0.0}});  // [1][0] impossible
  g.edges.push_back({2, 1, {0.0, 0.0, 0.0, 0.0, 0.0, 3.0}});
  auto r = SolveByElimination(g);
  REQUIRE(r.ok());
  CHECK(r->choice == std::vector<int>{2, 0, 2});
  CHECK(r->cost == 9.0);
}

TEST_CASE("infinite costs: no finite choice costs +infinity, not NaN") {
  CostGraph g;
  g.node_costs = {{kInf, 1.0}, {1.0, kInf}};
  g.edges.push_back({0, 1, {0.0, 0.0, kInf, 0.0}});
  auto r = SolveByElimination(g);
  REQUIRE(r.ok());
  CHECK(r->cost == kInf);
}

TEST_CASE("tied nodes take one config") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> nodes(2, 6);
  for (int trial = 0; trial < 300; ++trial) {
    INFO("trial " << trial);
    const int n = nodes(rng);
    CostGraph g = RandomNodes(rng, n, 3, 3);  // tied nodes need equal config counts
    g.tie_group.resize(n);
    for (int& t : g.tie_group) t = static_cast<int>(rng() % 4) - 1;  // -1 (free), 0, 1 or 2
    for (int v = 0; v + 1 < n; ++v) AddRandomEdge(g, rng, v, v + 1);
    if (trial % 3 == 0)
      for (int a = 0; a < n; ++a)
        for (int b = a + 2; b < n; ++b)
          if (rng() % 2) AddRandomEdge(g, rng, a, b);
    // A chain has at most 5 edges here: contracted, it cannot hold a K4 (6
    // edges), so the rules reduce it fully.
    CheckAgainstBruteForce(g, trial % 3 != 0);
  }
}

TEST_CASE("a tie changes the answer") {
  CostGraph g;
  g.node_costs = {{0.0, 5.0}, {6.0, 0.0}, {1.0, 1.0}};
  g.edges.push_back({0, 2, {0.0, 0.0, 0.0, 0.0}});
  auto free = SolveByElimination(g);
  REQUIRE(free.ok());
  CHECK(free->choice == std::vector<int>{0, 1, 0});
  g.tie_group = {3, 3, -1};
  auto tied = SolveByElimination(g);
  REQUIRE(tied.ok());
  CHECK(tied->choice == std::vector<int>{1, 1, 0});
  CHECK(tied->cost == 6.0);
  CHECK(tied->nodes_eliminated == 3);
  CHECK(*CostOf(g, {0, 1, 0}) == kInf);  // breaks the tie
}

TEST_CASE("bad graphs are rejected naming the node or edge") {
  CostGraph good;
  good.node_costs = {{1.0, 2.0}, {3.0, 4.0, 5.0}, {0.0}};
  good.edges.push_back({0, 1, std::vector<double>(6, 0.0)});
  REQUIRE(SolveByElimination(good).ok());
  auto rejects = [](const CostGraph& g, const std::string& message) {
    auto r = SolveByElimination(g);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message() == message);
    auto cost = CostOf(g, std::vector<int>(g.node_costs.size(), 0));
    REQUIRE(!cost.ok());
    CHECK(cost.status().message() == message);
  };
  CostGraph g = good;
  g.edges[0].costs.pop_back();
  rejects(g, "edge 0 (node 0 -> node 1) has 5 costs, expected 2 x 3 = 6");
  g = good;
  g.edges.push_back({1, 3, {}});
  rejects(g, "edge 1 (node 1 -> node 3) names a node outside the graph's 3 nodes");
  g = good;
  g.edges.push_back({-1, 0, {}});
  rejects(g, "edge 1 (node -1 -> node 0) names a node outside the graph's 3 nodes");
  g = good;
  g.edges.push_back({2, 2, {0.0}});
  rejects(g, "edge 1 (node 2 -> node 2) joins a node to itself");
  g = good;
  g.node_costs[2].clear();
  rejects(g, "node 2 has no configurations");
  g = good;
  g.node_costs[1][2] = std::nan("");
  rejects(g, "node 1 config 2 costs nan (costs must be numbers or +infinity)");
  g = good;
  g.edges[0].costs[4] = -kInf;
  rejects(g, "edge 0 (node 0 -> node 1)[1][1] costs -inf (costs must be numbers or +infinity)");
  g = good;
  g.tie_group = {0, 0};
  rejects(g, "tie_group has 2 entries for 3 nodes");
  g = good;
  g.tie_group = {0, 0, -1};
  rejects(g, "nodes 0 and 1 share tie group 0 but have 2 and 3 configurations");
  g = good;
  g.tie_group = {-2, -1, -1};
  rejects(g, "node 0 has tie group -2 (expected -1 for free, or an id >= 0)");

  auto negative_limit = SolveByElimination(good, -1);
  REQUIRE(!negative_limit.ok());
  CHECK(negative_limit.status().message() == "max_enumeration must be >= 0, got -1");

  auto short_choice = CostOf(good, {0, 0});
  REQUIRE(!short_choice.ok());
  CHECK(short_choice.status().message() == "the choice has 2 configs for 3 nodes");
  auto bad_index = CostOf(good, {0, 3, 0});
  REQUIRE(!bad_index.ok());
  CHECK(bad_index.status().message() == "node 1 takes config 3 of 3");
  CHECK(*CostOf(good, {1, 2, 0}) == 7.0);
}

// Viterbi over a chain whose edge i joins nodes i and i + 1 (either way round).
double ChainMinimum(const CostGraph& g) {
  std::vector<double> best = g.node_costs[0];
  for (size_t v = 1; v < g.node_costs.size(); ++v) {
    const CostGraph::Edge& e = g.edges[v - 1];
    const size_t kp = g.node_costs[v - 1].size(), k = g.node_costs[v].size();
    std::vector<double> next(k, kInf);
    for (size_t c = 0; c < k; ++c)
      for (size_t p = 0; p < kp; ++p) {
        const double edge = e.from == static_cast<int>(v) - 1 ? e.costs[p * k + c] : e.costs[c * kp + p];
        next[c] = std::min(next[c], best[p] + edge);
      }
    for (size_t c = 0; c < k; ++c) best[c] = next[c] + g.node_costs[v][c];
    best.resize(k);
  }
  return *std::min_element(best.begin(), best.end());
}

double SolveTimed(const CostGraph& g, EliminationResult* out) {
  const auto start = std::chrono::steady_clock::now();
  auto r = SolveByElimination(g);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(r.ok());
  *out = *r;
  return seconds;
}

TEST_CASE("a 1,000-node chain of 100 configs each") {
  std::mt19937 rng(1000);
  CostGraph g = RandomNodes(rng, 1000, 100, 100);
  for (int v = 0; v + 1 < 1000; ++v) AddRandomEdge(g, rng, v, v + 1);
  const double expected = ChainMinimum(g);
  EliminationResult r;
  const double seconds = SolveTimed(g, &r);
  WARN("1,000-node chain, 100 configs: solved in " << seconds << " s");
  CHECK(Close(r.cost, expected));
  CHECK(r.nodes_eliminated == 1000);

  // Zero-cost skip edges leave the optimum alone but force node elimination
  // (O(|C|^3) per node) instead of unwinding from the leaves.
  for (int v = 0; v + 3 < 1000; v += 3) g.edges.push_back({v, v + 3, std::vector<double>(100 * 100, 0.0)});
  const double residual_seconds = SolveTimed(g, &r);
  WARN("the same chain with a skip edge over every 2 nodes: solved in " << residual_seconds << " s");
  CHECK(Close(r.cost, expected));
  CHECK(r.nodes_eliminated == 1000);
}

}  // namespace
}  // namespace loom
