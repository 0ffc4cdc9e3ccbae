/* svg_plot.h: a small self-contained SVG line chart writer for `flashcl bench --plot`. */
#ifndef FLASHCL_TOOLS_SVG_PLOT_H
#define FLASHCL_TOOLS_SVG_PLOT_H

#include <stddef.h>

/* One line: n points (x[i], y[i]); a point with y < 0 or non-finite is a gap. */
typedef struct svg_series {
    const char *label;
    const double *x, *y;
    int n;
} svg_series;

/* Writes a line chart of `count` series to `path` (via a temporary file and
 * rename): title, axis labels, grid, ticks, a legend on the right. x uses a
 * log2 axis when log_x (sequence lengths), y starts at 0. Returns 0, or -1
 * with a message in err. */
int svg_plot_write(const char *path, const char *title, const char *x_label, const char *y_label,
                   const svg_series *series, int count, int log_x, char *err, size_t err_size);
/* The same with the y axis running from 0 to exactly y_top (when y_top > 0 and no point is
 * above it), e.g. the number of batch slots. Series of more than 64 points get no markers. */
int svg_plot_write_ytop(const char *path, const char *title, const char *x_label, const char *y_label,
                        const svg_series *series, int count, int log_x, double y_top, char *err,
                        size_t err_size);

#endif /* FLASHCL_TOOLS_SVG_PLOT_H */
