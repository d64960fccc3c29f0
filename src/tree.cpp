// Helpers for trees: field-name parsing for PMAPCC_TREE structs.
#include <pmap/tree.h>

namespace pmap::detail {

std::vector<std::string> split_field_names(std::string_view list) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : list) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != ' ' && c != '\t' && c != '\n') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

}  // namespace pmap::detail
