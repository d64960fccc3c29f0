#include <pmapcc/train/optimizer.h>

#include <cctype>
#include <map>
#include <set>

namespace pmap::train::detail {

namespace {
bool is_index(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}
}  // namespace

std::vector<std::string> state_names(const std::vector<std::string>& paths, const std::vector<std::string>& names,
                                     const char* optimizer) {
  // Each field's indexed leaves: how many, so that only a vector as long as the parameters is named by them.
  std::map<std::string, std::size_t> indexed;
  auto split = [](const std::string& path) {
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? std::pair<std::string, std::string>{"", path}
                                      : std::pair{path.substr(0, slash), path.substr(slash + 1)};
  };
  auto per_parameter = [&](const std::string& parent, const std::string& last) {
    const std::string field = split(parent).second;
    return !parent.empty() && is_index(last) && !is_index(field) && last.size() < 10;
  };
  for (const std::string& p : paths) {
    const auto [parent, last] = split(p);
    if (per_parameter(parent, last)) ++indexed[parent];
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& p : paths) {
    const auto [parent, last] = split(p);
    const bool rename = per_parameter(parent, last) && indexed[parent] == names.size();
    out.push_back(rename ? parent + "/" + names[std::stoul(last)] : p);
    if (!seen.insert(out.back()).second)
      throw ValueError(std::string(optimizer) + ": two leaves of its state are both named '" + out.back() + "'");
  }
  return out;
}

std::vector<std::string> names_of(const Variables& v) {
  std::vector<std::string> out;
  for (const auto& [name, a] : v) out.push_back(name);
  return out;
}

std::string hyperparam_hint(std::string_view name) {
  return name == "weight_decay" ? " (optim::Sgd and optim::Adam take it when their own weight_decay is not 0)" : "";
}

}  // namespace pmap::train::detail
