// What every benchmark prints first: the machine, its load, and the command that ran.
#pragma once

#include <fstream>
#include <string>

namespace bench {

// The first line of a text file ("" when it cannot be read): /proc/loadavg gives the load averages.
inline std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The CPU's model name from /proc/cpuinfo.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// argv joined by spaces.
inline std::string command_line(int argc, char** argv) {
  std::string command = argv[0];
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  return command;
}

}  // namespace bench
