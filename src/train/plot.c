/* plot.c — the loss curve as a small self-contained SVG (train loss as a line, validation loss as
 * a line with dots), written atomically next to the checkpoint at the end of training. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/strbuf.h"
#include "ember/train.h"

enum { W = 800, H = 450, ML = 60, MR = 20, MT = 40, MB = 50 };

/* A "nice" tick spacing (1, 2 or 5 times a power of ten) giving about `n` ticks over span. */
static double nice_step(double span, int n)
{
    if (!(span > 0)) return 1;
    double raw = span / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void escape(em_strbuf *sb, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '<')
            em_sb_append(sb, "&lt;");
        else if (*s == '>')
            em_sb_append(sb, "&gt;");
        else if (*s == '&')
            em_sb_append(sb, "&amp;");
        else
            em_sb_appendc(sb, *s);
    }
}

typedef struct frame {
    double x0, x1, y0, y1; /* data ranges */
} frame;

static double px(const frame *f, double x)
{
    return ML + (x - f->x0) / (f->x1 - f->x0) * (W - ML - MR);
}
static double py(const frame *f, double y)
{
    return H - MB - (y - f->y0) / (f->y1 - f->y0) * (H - MT - MB);
}

static void series(em_strbuf *sb, const frame *f, const double *xs, const double *ys, int64_t n,
                   const char *color, bool dots)
{
    if (n <= 0) return;
    em_sb_printf(sb, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ys[i])) em_sb_printf(sb, "%.1f,%.1f ", px(f, xs[i]), py(f, ys[i]));
    em_sb_append(sb, "\"/>\n");
    for (int64_t i = 0; dots && i < n; i++)
        if (isfinite(ys[i]))
            em_sb_printf(sb, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                         px(f, xs[i]), py(f, ys[i]), color);
}

em_status em_train_plot_svg(const char *path, const double *steps, const double *loss, int64_t n,
                            const double *vsteps, const double *vloss, int64_t nv,
                            const char *title)
{
    if (!path || (n > 0 && (!steps || !loss)) || (nv > 0 && (!vsteps || !vloss)))
        return em_set_error(EM_ERR_INVALID, "em_train_plot_svg: missing data");
    frame f = {INFINITY, -INFINITY, INFINITY, -INFINITY};
    for (int64_t i = 0; i < n + nv; i++) {
        double x = i < n ? steps[i] : vsteps[i - n], y = i < n ? loss[i] : vloss[i - n];
        if (!isfinite(y)) continue;
        f.x0 = fmin(f.x0, x), f.x1 = fmax(f.x1, x), f.y0 = fmin(f.y0, y), f.y1 = fmax(f.y1, y);
    }
    if (!isfinite(f.x0)) f = (frame){0, 1, 0, 1};
    if (f.x1 <= f.x0) f.x1 = f.x0 + 1;
    if (f.y1 <= f.y0) f.y1 = f.y0 + 1;
    double ys = nice_step(f.y1 - f.y0, 6), xs = nice_step(f.x1 - f.x0, 8);
    f.y0 = floor(f.y0 / ys) * ys, f.y1 = ceil(f.y1 / ys) * ys;
    f.x0 = floor(f.x0 / xs) * xs, f.x1 = ceil(f.x1 / xs) * xs;
    em_strbuf sb;
    em_sb_init(&sb);
    em_sb_printf(&sb,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
                 "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                 W, H, W, H);
    em_sb_printf(&sb, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", W / 2);
    escape(&sb, title ? title : "loss");
    em_sb_append(&sb, "</text>\n");
    for (double y = f.y0; y <= f.y1 + ys * 1e-6; y += ys) {
        em_sb_printf(&sb,
                     "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                     "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                     ML, W - MR, py(&f, y), py(&f, y), ML - 6, py(&f, y) + 4, y);
    }
    for (double x = f.x0; x <= f.x1 + xs * 1e-6; x += xs) {
        em_sb_printf(&sb,
                     "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#eee\"/>"
                     "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
                     px(&f, x), px(&f, x), MT, H - MB, px(&f, x), H - MB + 16, x);
    }
    em_sb_printf(&sb,
                 "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                 "stroke=\"#444\"/>\n"
                 "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n"
                 "<text x=\"16\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">"
                 "loss (nats/token)</text>\n",
                 ML, MT, W - ML - MR, H - MT - MB, (ML + W - MR) / 2, H - 12, (MT + H - MB) / 2,
                 (MT + H - MB) / 2);
    series(&sb, &f, steps, loss, n, "#1f77b4", false);
    series(&sb, &f, vsteps, vloss, nv, "#ff7f0e", true);
    em_sb_printf(&sb,
                 "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#1f77b4\" "
                 "stroke-width=\"2\"/><text x=\"%d\" y=\"%d\">train</text>\n",
                 W - MR - 150, W - MR - 130, MT + 14, MT + 14, W - MR - 125, MT + 18);
    if (nv > 0)
        em_sb_printf(&sb,
                     "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#ff7f0e\" "
                     "stroke-width=\"2\"/><text x=\"%d\" y=\"%d\">validation</text>\n",
                     W - MR - 150, W - MR - 130, MT + 32, MT + 32, W - MR - 125, MT + 36);
    em_sb_append(&sb, "</svg>\n");
    char *text = em_sb_take(&sb);
    if (!text) return em_set_error(EM_ERR_NOMEM, "em_train_plot_svg: out of memory");
    em_status st = em_file_write_atomic(path, text, strlen(text));
    free(text);
    return st;
}
