// A small router for megahub: routes are (methods, pattern) pairs tried in
// the order they were added; the first match wins. Patterns match the
// request's percent-decoded path segments (so an encoded '/' inside a
// segment never splits it):
//   "/api/repos/{ns}/{name}"   literal segments and one-segment captures;
//   "(models|datasets|spaces)" one of several literals, captured;
//   "*"                        one or more trailing segments, joined by '/';
//   "*?"                       zero or more trailing segments.
// Methods: "GET|POST"; a GET route also answers HEAD; "*" is any method.
#ifndef MEGACKPT_SRC_HUB_ROUTER_H_
#define MEGACKPT_SRC_HUB_ROUTER_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace megackpt::hub {

// What a matched pattern captured: the `{x}` and `(a|b)` segments in order,
// and the trailing segments of `*` / `*?` joined by '/' ("" when none).
struct RouteMatch {
  std::vector<std::string> params;
  std::string tail;
};

template <typename Handler>
class Router {
 public:
  void Add(std::string_view methods, std::string_view pattern, Handler handler) {
    Route r;
    for (size_t start = 0; start <= methods.size();) {
      size_t bar = methods.find('|', start);
      r.methods.emplace_back(
          methods.substr(start, bar == std::string_view::npos ? bar : bar - start));
      if (bar == std::string_view::npos) break;
      start = bar + 1;
    }
    std::string_view p = pattern;
    if (!p.empty() && p.front() == '/') p.remove_prefix(1);
    while (!p.empty()) {
      size_t slash = p.find('/');
      r.pattern.emplace_back(p.substr(0, slash));
      if (slash == std::string_view::npos) break;
      p.remove_prefix(slash + 1);
    }
    r.handler = std::move(handler);
    routes_.push_back(std::move(r));
  }

  // The handler of the first route matching (method, segments), or nullptr.
  const Handler* Find(std::string_view method, const std::vector<std::string>& segments,
                      RouteMatch* match) const {
    for (const Route& r : routes_) {
      if (!MethodMatches(r, method)) continue;
      RouteMatch m;
      if (Matches(r.pattern, segments, &m)) {
        *match = std::move(m);
        return &r.handler;
      }
    }
    return nullptr;
  }

 private:
  struct Route {
    std::vector<std::string> methods;
    std::vector<std::string> pattern;
    Handler handler;
  };

  static bool MethodMatches(const Route& r, std::string_view method) {
    for (const auto& m : r.methods) {
      if (m == "*" || m == method || (m == "GET" && method == "HEAD")) return true;
    }
    return false;
  }

  static bool Matches(const std::vector<std::string>& pattern, const std::vector<std::string>& seg,
                      RouteMatch* m) {
    size_t i = 0;
    for (; i < pattern.size(); ++i) {
      const std::string& p = pattern[i];
      if (p == "*" || p == "*?") {
        if (p == "*" && i >= seg.size()) return false;
        for (size_t j = i; j < seg.size(); ++j) m->tail += (j > i ? "/" : "") + seg[j];
        return true;
      }
      if (i >= seg.size()) return false;
      if (p.size() >= 2 && p.front() == '{' && p.back() == '}') {
        m->params.push_back(seg[i]);
      } else if (p.size() >= 2 && p.front() == '(' && p.back() == ')') {
        bool any = false;
        std::string_view alts = std::string_view(p).substr(1, p.size() - 2);
        for (size_t start = 0; start <= alts.size() && !any;) {
          size_t bar = alts.find('|', start);
          any = alts.substr(start, bar == std::string_view::npos ? bar : bar - start) == seg[i];
          if (bar == std::string_view::npos) break;
          start = bar + 1;
        }
        if (!any) return false;
        m->params.push_back(seg[i]);
      } else if (p != seg[i]) {
        return false;
      }
    }
    return i == seg.size();
  }

  std::vector<Route> routes_;
};

}  // namespace megackpt::hub

#endif  // MEGACKPT_SRC_HUB_ROUTER_H_
