/* tune.h: the `flashcl tune` subcommand (tools/tune.c). */
#ifndef FLASHCL_TOOLS_TUNE_H
#define FLASHCL_TOOLS_TUNE_H

extern const char usage_tune[];
/* argv[1] is "tune"; returns the tool's exit status. */
int cmd_tune(int argc, char **argv);

#endif /* FLASHCL_TOOLS_TUNE_H */
