/* spec_sim.h: `flashcl spec-sim` (speculative verification against given target and draft rows). */
#ifndef FLASHCL_TOOLS_SPEC_SIM_H
#define FLASHCL_TOOLS_SPEC_SIM_H

extern const char usage_spec_sim[];
/* argv[1] is the command's name; return the tool's exit status. */
int cmd_spec_sim(int argc, char **argv);

#endif /* FLASHCL_TOOLS_SPEC_SIM_H */
