// `lily <command>`: each command lives in its own cmd_*.cpp and registers itself here. The setup
// function declares the command's options on `app` and returns the function that runs it.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace lily::cli {

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App& app)>;

struct Command {
  std::string name, help;
  Setup setup;
};

std::vector<Command>& commands();

struct Register {
  Register(std::string name, std::string help, Setup setup) {
    commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

// Parses "1,2,3" (commas and/or white space) into token ids; throws InputError naming `what`.
std::vector<int32_t> parse_ids(const std::string& s, const std::string& what);

}  // namespace lily::cli
