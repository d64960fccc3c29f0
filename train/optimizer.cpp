#include <pmapcc/train/optimizer.h>

namespace pmap::train::detail {

namespace {
bool is_index(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}
}  // namespace

std::string state_name(const std::string& path, const std::vector<std::string>& names) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return path;
  const std::string last = path.substr(slash + 1), parent = path.substr(0, slash);
  const auto before = parent.rfind('/');
  const std::string field = before == std::string::npos ? parent : parent.substr(before + 1);
  if (!is_index(last) || is_index(field) || last.size() > 9) return path;
  const auto i = static_cast<std::size_t>(std::stoul(last));
  return i < names.size() ? parent + "/" + names[i] : path;
}

std::vector<std::string> names_of(const Variables& v) {
  std::vector<std::string> out;
  for (const auto& [name, a] : v) out.push_back(name);
  return out;
}

}  // namespace pmap::train::detail
