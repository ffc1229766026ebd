// The rank process's side (worker/rank_process.h starts it): the worker's own executable, run
// as `EXE --moetrain-rank-process=FD,PID`, runs one rank of an assignment for the worker PID,
// talking to it over the socket at FD. The executables that run workers (moetrain-worker, and
// moetrain for `moetrain run`) hand such an invocation over first thing in main:
//
//   int main(int argc, char** argv) {
//     if (moetrain::IsRankProcess(argc, argv)) return moetrain::RankProcessMain(argc, argv);
//     ...
#ifndef MOETRAIN_WORKER_RANK_MAIN_H_
#define MOETRAIN_WORKER_RANK_MAIN_H_

#include <sys/types.h>

#include <string>

namespace moetrain {

// Where the rank process finds its end of the channel.
inline constexpr int kRankChannelFd = 3;

// The argument that makes an executable a rank process of the worker `agent`.
std::string RankProcessFlag(pid_t agent);

// Whether argv is a rank process's invocation.
bool IsRankProcess(int argc, char** argv);

// Runs the rank the worker sends and returns only on a bad invocation (exit status 2); every
// other end leaves by _exit: 0 once the end report is sent, 3 when the worker is gone (it can no
// longer report for the rank, nor hold the checkpoint lease).
int RankProcessMain(int argc, char** argv);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_RANK_MAIN_H_
