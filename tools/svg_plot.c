/* svg_plot.c: a small self-contained SVG line chart writer (no plotting dependency). */
#define _POSIX_C_SOURCE 200809L

#include "svg_plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Geometry, in SVG user units: the plot area sits inside these margins; the
 * legend takes the right margin. */
enum { WIDTH = 900, HEIGHT = 520, LEFT = 80, RIGHT = 250, TOP = 56, BOTTOM = 66 };

/* Tableau 10: distinct for up to ten lines, readable by most colour-blind viewers. */
static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
/* After ten lines the dash pattern changes too. */
static const char *const dashes[] = {"", "6,3", "2,3"};

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* 1, 2 or 5 times a power of ten, at least raw. */
static double nice_step(double raw) {
    double p = pow(10.0, floor(log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static void tick_label(double v, char *buf, size_t n) {
    if (v >= 1024 && fmod(v, 1024) == 0)
        snprintf(buf, n, "%gk", v / 1024);
    else
        snprintf(buf, n, "%g", v);
}

static int usable(double x, double y, int log_x) {
    return isfinite(x) && isfinite(y) && y >= 0 && (!log_x || x > 0);
}

/* A series with more points than this is drawn as a line without markers (thousands of
 * circles bury the line and bloat the file). */
enum { MARKER_MAX = 64 };

/* The y step for an axis that ends exactly at top: 1, 2, 4 or 5 times a power of ten, at most
 * 8 intervals, dividing top; 0 when none does. */
static double step_dividing(double top) {
    static const double mult[] = {1, 2, 4, 5};
    for (double p = 1e-3; p <= top; p *= 10)
        for (int i = 0; i < 4; i++) {
            double step = mult[i] * p, n = top / step;
            if (n <= 8 && fabs(n - round(n)) < 1e-9)
                return step;
        }
    return 0;
}

int svg_plot_write(const char *path, const char *title, const char *x_label, const char *y_label,
                   const svg_series *series, int count, int log_x, char *err, size_t err_size) {
    return svg_plot_write_ytop(path, title, x_label, y_label, series, count, log_x, 0.0, err, err_size);
}

int svg_plot_write_ytop(const char *path, const char *title, const char *x_label, const char *y_label,
                        const svg_series *series, int count, int log_x, double y_top, char *err,
                        size_t err_size) {
    double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
    for (int s = 0; s < count; s++)
        for (int i = 0; i < series[s].n; i++) {
            double x = series[s].x[i], y = series[s].y[i];
            if (!usable(x, y, log_x))
                continue;
            x = log_x ? log2(x) : x;
            xmin = x < xmin ? x : xmin;
            xmax = x > xmax ? x : xmax;
            ymax = y > ymax ? y : ymax;
        }
    if (!(xmin <= xmax)) {
        snprintf(err, err_size, "nothing to plot: no row has a time");
        return -1;
    }
    if (xmax - xmin < 1e-9) { /* one x value: widen so the point sits in the middle */
        xmin -= log_x ? 1 : 0.5 * (fabs(xmin) + 1);
        xmax += log_x ? 1 : 0.5 * (fabs(xmax) + 1);
    }
    double ystep = nice_step((ymax > 0 ? ymax : 1) / 5), ytop = ceil((ymax > 0 ? ymax : 1) / ystep) * ystep;
    if (y_top > 0 && y_top >= ymax) { /* the caller's bound (16 slots: 0..16, not 0..20) */
        ytop = y_top;
        ystep = step_dividing(y_top);
        if (ystep == 0)
            ystep = nice_step(y_top / 5);
    }
    double pw = WIDTH - LEFT - RIGHT, ph = HEIGHT - TOP - BOTTOM;
#define PX(x) (LEFT + ((log_x ? log2(x) : (x)) - xmin) / (xmax - xmin) * pw)
#define PY(y) (TOP + ph - (y) / ytop * ph)

    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    FILE *f = NULL;
    if (tmp) {
        snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
        f = fopen(tmp, "w");
    }
    if (!f) {
        snprintf(err, err_size, "cannot write %s: %s", path, tmp ? strerror(errno) : "out of memory");
        free(tmp);
        return -1;
    }
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"13\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            WIDTH, HEIGHT, WIDTH, HEIGHT);
    fprintf(f, "<text x=\"%d\" y=\"30\" font-size=\"17\" font-weight=\"bold\">", LEFT);
    xml_text(f, title);
    fputs("</text>\n", f);

    /* y grid and ticks */
    for (double y = 0; y <= ytop + ystep * 1e-6; y += ystep) {
        char label[32];
        snprintf(label, sizeof label, "%g", y);
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"#333\">%s</text>\n",
                LEFT, PY(y), LEFT + pw, PY(y), LEFT - 8, PY(y) + 4, label);
    }
    /* x grid and ticks: powers of two on a log axis, else nice steps */
    if (log_x) {
        for (double e = ceil(xmin - 1e-9); e <= xmax + 1e-9; e += 1) {
            char label[32];
            double x = pow(2.0, e);
            tick_label(x, label, sizeof label);
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#333\">%s</text>\n",
                    PX(x), TOP, PX(x), TOP + ph, PX(x), TOP + ph + 18, label);
        }
    } else {
        double step = nice_step((xmax - xmin) / 6);
        for (double x = ceil(xmin / step) * step; x <= xmax + step * 1e-6; x += step) {
            char label[32];
            tick_label(x, label, sizeof label);
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#333\">%s</text>\n",
                    PX(x), TOP, PX(x), TOP + ph, PX(x), TOP + ph + 18, label);
        }
    }
    /* axes and their labels */
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#333\"/>\n"
            "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">",
            LEFT, TOP, pw, ph, LEFT + pw / 2, HEIGHT - 20);
    xml_text(f, x_label);
    fprintf(f, "</text>\n<text transform=\"translate(22 %.1f) rotate(-90)\" text-anchor=\"middle\">",
            TOP + ph / 2);
    xml_text(f, y_label);
    fputs("</text>\n", f);

    /* the lines, with a marker on each measured point */
    for (int s = 0; s < count; s++) {
        const char *color = palette[s % 10], *dash = dashes[(s / 10) % 3];
        int open = 0;
        for (int i = 0; i < series[s].n; i++) {
            double x = series[s].x[i], y = series[s].y[i];
            if (!usable(x, y, log_x)) {
                if (open)
                    fputs("\"/>\n", f);
                open = 0;
                continue;
            }
            if (!open)
                fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s%s%s points=\"", color,
                        dash[0] ? " stroke-dasharray=\"" : "", dash, dash[0] ? "\"" : "");
            fprintf(f, "%s%.1f,%.1f", open ? " " : "", PX(x), PY(y));
            open = 1;
        }
        if (open)
            fputs("\"/>\n", f);
        for (int i = 0; i < series[s].n && series[s].n <= MARKER_MAX; i++)
            if (usable(series[s].x[i], series[s].y[i], log_x))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%g: %.4g</title></circle>\n",
                        PX(series[s].x[i]), PY(series[s].y[i]), color, series[s].x[i], series[s].y[i]);
        /* legend entry */
        double ly = TOP + 10 + 22.0 * s;
        fprintf(f,
                "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s%s%s/>\n"
                "<text x=\"%.0f\" y=\"%.1f\">",
                LEFT + pw + 16, ly, LEFT + pw + 44, ly, color, dash[0] ? " stroke-dasharray=\"" : "", dash,
                dash[0] ? "\"" : "", LEFT + pw + 50, ly + 4);
        xml_text(f, series[s].label);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
#undef PX
#undef PY
    int bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, err_size, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}
