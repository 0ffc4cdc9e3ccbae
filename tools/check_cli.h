/* check_cli.h: `flashcl check`, random cases against host_ref (tools/check_cli.c). */
#ifndef FLASHCL_TOOLS_CHECK_CLI_H
#define FLASHCL_TOOLS_CHECK_CLI_H

extern const char usage_check[];
int cmd_check(int argc, char **argv);

#endif
