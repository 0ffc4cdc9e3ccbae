/* devices_cli.h: `flashcl devices`, the devices and the parameters flashcl picks
 * (tools/devices_cli.c). */
#ifndef FLASHCL_TOOLS_DEVICES_CLI_H
#define FLASHCL_TOOLS_DEVICES_CLI_H

extern const char usage_devices[];
int cmd_devices(int argc, char **argv);

#endif
