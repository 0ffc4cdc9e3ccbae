/* flashcl.c: the flashcl command-line tool: the command table and main; each subcommand is in
 * its own file (devices_cli.c, attention_cli.c, check_cli.c, bench_cli.c, tune.c, serve_sim.c, spec_sim.c). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "attention_cli.h"
#include "bench_cli.h"
#include "check_cli.h"
#include "cli_util.h"
#include "devices_cli.h"
#include "flashcl.h"
#include "serve_sim.h"
#include "spec_sim.h"
#include "tune.h"

/* ======================================================================
 * Usage texts
 * ==================================================================== */

static const char usage_main[] =
    "usage: flashcl <command> [options]\n"
    "\n"
    "commands:\n"
    "  devices     list OpenCL platforms and devices and the parameters flashcl picks\n"
    "  attention   run attention on .npy files\n"
    "  check       compare random problems against the reference implementation\n"
    "  bench       validate, then time the forward kernel\n"
    "  tune        search kernel parameters for a device and save the fastest\n"
    "  serve-sim   replay a request trace: static vs continuous batching on real kernels\n"
    "  spec-sim    check speculative-decoding verification on .npy distributions\n"
    "  help CMD    show the options of a command\n"
    "\n"
    "  --help      show this text\n"
    "  --version   show the tool's and the library's version\n"
    "\n"
    "Devices (--device SPEC, else $FLASHCL_DEVICE, else the first GPU, else any device):\n"
    "  gpu, cpu, accelerator, host (no OpenCL); PLATFORM:DEVICE, each an index from\n"
    "  'flashcl devices' or a word of the platform's name, vendor or version and of the\n"
    "  device's name or vendor, either part empty (0:1, intel:, nvidia:H100); or one word,\n"
    "  the platform it names first, then a device whose name holds it (nvidia, pocl).\n"
    "  'flashcl devices --device SPEC' shows the device a spec picks.\n";

/* ======================================================================
 * main
 * ==================================================================== */

typedef struct command {
    const char *name;
    const char *usage;
    int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"devices", usage_devices, cmd_devices},
    {"attention", usage_attention, cmd_attention},
    {"check", usage_check, cmd_check},
    {"bench", usage_bench, cmd_bench},
    {"tune", usage_tune, cmd_tune},
    {"serve-sim", usage_serve_sim, cmd_serve_sim},
    {"spec-sim", usage_spec_sim, cmd_spec_sim},
};

static const command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    const command *cmd;
    if (argc < 2) {
        fputs(usage_main, stderr);
        return CLI_EXIT_USAGE;
    }
    if (cli_help(argv[1], usage_main)) {
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
        printf("flashcl %s (library %s)\n", FLASHCL_VERSION_STRING, flashcl_version());
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "help") == 0) {
        if (argc == 2) {
            fputs(usage_main, stdout);
            return CLI_EXIT_OK;
        }
        cmd = find_command(argv[2]);
        if (cmd == NULL || argc > 3)
            return cli_usage_error(usage_main, "no help for '%s'", argc > 3 ? argv[3] : argv[2]);
        fputs(cmd->usage, stdout);
        return CLI_EXIT_OK;
    }
    cmd = find_command(argv[1]);
    if (cmd == NULL && argv[1][0] == '-')
        return cli_unknown_option(usage_main, argv[1]);
    if (cmd == NULL) {
        char names[160] = "help", near[32];
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), " %s", commands[i].name);
        if (cli_nearest_word(argv[1], names, near, sizeof near))
            return cli_usage_error(usage_main, "unknown command '%s'; did you mean '%s'?", argv[1],
                                   near);
        return cli_usage_error(usage_main, "unknown command '%s'", argv[1]);
    }
    return cmd->run(argc, argv);
}
