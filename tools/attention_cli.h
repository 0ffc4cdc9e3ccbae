/* attention_cli.h: `flashcl attention`, attention on .npy files (tools/attention_cli.c). */
#ifndef FLASHCL_TOOLS_ATTENTION_CLI_H
#define FLASHCL_TOOLS_ATTENTION_CLI_H

extern const char usage_attention[];
int cmd_attention(int argc, char **argv);

#endif
