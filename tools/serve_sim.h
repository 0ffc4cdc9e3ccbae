/* serve_sim.h: `flashcl serve-sim` (continuous vs static batching on a request trace). */
#ifndef FLASHCL_TOOLS_SERVE_SIM_H
#define FLASHCL_TOOLS_SERVE_SIM_H

extern const char usage_serve_sim[];
/* argv[1] is the command's name; return the tool's exit status. */
int cmd_serve_sim(int argc, char **argv);

#endif /* FLASHCL_TOOLS_SERVE_SIM_H */
