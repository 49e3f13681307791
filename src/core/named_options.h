// Options set by name from `name=value` strings over one table of fields (the backends' --cpu-opt and
// --cuda-opt). An unknown name or a malformed string is an InputError naming the flag and the known names.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace lily {

template <class O>
struct NamedField {
  const char* name;
  const char* help;
  std::function<void(O&, const std::string&)> set;
};

template <class O>
void set_named_option(const std::vector<NamedField<O>>& fields, O& o, const char* flag, const std::string& name,
                      const std::string& value) {
  for (const NamedField<O>& f : fields)
    if (name == f.name) {
      f.set(o, value);
      return;
    }
  std::string names;
  for (const NamedField<O>& f : fields) names += std::string(names.empty() ? "" : ", ") + f.name;
  fail("{} {}: unknown option (known: {})", flag, name, names);
}

template <class O>
void set_named_option(const std::vector<NamedField<O>>& fields, O& o, const char* flag, const std::string& name_eq_value) {
  const size_t eq = name_eq_value.find('=');
  if (eq == std::string::npos || eq == 0) fail("{} {}: expected name=value", flag, name_eq_value);
  set_named_option(fields, o, flag, name_eq_value.substr(0, eq), name_eq_value.substr(eq + 1));
}

// "name: help" per field.
template <class O>
std::vector<std::string> named_option_help(const std::vector<NamedField<O>>& fields) {
  std::vector<std::string> n;
  for (const NamedField<O>& f : fields) n.push_back(std::string(f.name) + ": " + f.help);
  return n;
}

}  // namespace lily
