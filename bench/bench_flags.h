// The command line of the benchmarks and the demo, with CLI11: the check of a count flag, and the
// one way a parse ends (--help: exit 0; any usage error: exit 2, CLI11 naming the flag).
#ifndef MOETRAIN_BENCH_BENCH_FLAGS_H_
#define MOETRAIN_BENCH_BENCH_FLAGS_H_

#include <limits>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"

namespace moetrain::bench {

// The check of a count flag: a whole number from `min` to INT_MAX ("--reps: Value 0 not in range
// 1 to 2147483647"). CLI::PositiveNumber takes any positive double and spells DBL_MAX out.
inline CLI::Range AtLeast(int min) {
  return CLI::Range(min, std::numeric_limits<int>::max(),
                    min == 1 ? std::string("POSITIVE") : "AT LEAST " + std::to_string(min));
}

// Parses argv into `app`. Returns nullopt to go on, else the exit status: 0 after --help (the
// help on stdout), 2 for bad usage (an unknown flag, a missing or bad value: CLI11 names the flag
// and the value on stderr).
inline std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace moetrain::bench

#endif  // MOETRAIN_BENCH_BENCH_FLAGS_H_
