/* dashboard.c — what a training run shows. On a terminal, a full-screen ncurses view: the model
 * and device, a progress bar with the ETA, the latest loss / validation loss / learning rate /
 * tokens per second / step time / device memory, the train and validation loss curves drawn in
 * text, the latest sample and messages; 'q' asks the loop to stop (it saves a checkpoint first).
 * Otherwise plain log lines, one per reported step, that read well in a file or CI log. */
#include <curses.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ember/train.h"

struct em_dashboard {
    em_dashboard_mode mode; /* TUI, PLAIN or QUIET (AUTO resolved) */
    FILE *out;              /* plain output */
    SCREEN *scr;            /* ncurses screen (TUI) */
    em_train_info info;     /* from begin */
    char device[160];       /* copies of info's strings */
    em_train_metrics last;  /* latest step */
    double last_val;        /* latest validation loss */
    double *sx, *sy;        /* train loss history */
    int64_t ns, caps;
    double *vx, *vy; /* validation history */
    int64_t nv, capv;
    char sample[2048]; /* latest sample */
    int64_t sample_step;
    char msg[4][256]; /* latest messages, oldest first */
    bool stop;        /* 'q' pressed */
};

static void push(double **x, double **y, int64_t *n, int64_t *cap, double a, double b)
{
    if (*n == *cap) {
        int64_t c = *cap ? *cap * 2 : 1024;
        double *nx = realloc(*x, (size_t)c * sizeof *nx);
        if (nx) *x = nx;
        double *ny = realloc(*y, (size_t)c * sizeof *ny);
        if (ny) *y = ny;
        if (!nx || !ny) return;
        *cap = c;
    }
    (*x)[*n] = a;
    (*y)[(*n)++] = b;
}

static void fmt_time(double s, char *buf, size_t size)
{
    if (!isfinite(s) || s < 0) {
        snprintf(buf, size, "--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, size, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, size, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, size, "%lds", t);
}

static void fmt_bytes(double b, char *buf, size_t size)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, size, "%.1f %s", b, u[i]);
}

/* ---- plain ----------------------------------------------------------------------------------- */

/* ", 2 ranks (mpi)" for a data-parallel run, "" otherwise. */
static void fmt_ranks(const em_train_info *i, char *buf, size_t size)
{
    buf[0] = 0;
    if (i->world > 1)
        snprintf(buf, size, ", %d ranks (%s)", i->world, i->dist_engine ? i->dist_engine : "?");
}

static void plain_begin(em_dashboard *d)
{
    const em_train_info *i = &d->info;
    char ranks[64];
    fmt_ranks(i, ranks, sizeof ranks);
    fprintf(d->out,
            "ember train: %lld parameters (%lld layers, %lld heads, width %lld, context %lld, "
            "vocab %lld) on %s (%s)%s%s\n",
            (long long)i->num_params, (long long)i->model.n_layer, (long long)i->model.n_head,
            (long long)i->model.n_embd, (long long)i->model.block_size,
            (long long)i->model.vocab_size, i->device, d->device, i->bf16 ? ", bf16" : "", ranks);
    if (i->max_steps == INT64_MAX) /* no step limit: a time budget ends the run */
        fprintf(d->out,
                "ember train: %lld tokens per step, from step %lld until the time limit, "
                "output in %s\n",
                (long long)i->tokens_per_step, (long long)i->start_step, i->out_dir);
    else
        fprintf(d->out, "ember train: %lld tokens per step, steps %lld to %lld, output in %s\n",
                (long long)i->tokens_per_step, (long long)i->start_step, (long long)i->max_steps,
                i->out_dir);
    fflush(d->out);
}

/* The goal of a step line: "?" while a run with no step limit has no estimate yet. */
static void fmt_goal(int64_t goal, char *buf, size_t size)
{
    if (goal == INT64_MAX)
        snprintf(buf, size, "?");
    else
        snprintf(buf, size, "%lld", (long long)goal);
}

static void plain_step(em_dashboard *d, const em_train_metrics *m)
{
    char eta[32], goal[24];
    fmt_time(m->eta_s, eta, sizeof eta);
    fmt_goal(m->max_steps, goal, sizeof goal);
    fprintf(d->out,
            "step %6lld/%s | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | %7.1f ms | eta %s\n",
            (long long)m->step, goal, m->loss, m->lr, m->grad_norm, m->tokens_per_s, m->step_ms,
            eta);
    fflush(d->out);
}

/* ---- full screen ----------------------------------------------------------------------------- */

/* The step count the run is heading for: the last step's (with a time budget, the steps expected
 * to fit in it), else the configured one. */
static int64_t goal_steps(const em_dashboard *d)
{
    return d->last.max_steps > 0 ? d->last.max_steps : d->info.max_steps;
}

/* The loss curves in the box [y0, y0 + h) x [0, COLS): train as '*', validation as 'o'. */
static void draw_chart(em_dashboard *d, int y0, int h)
{
    int lw = 9, w = COLS - lw - 1;
    if (h < 4 || w < 10) return;
    if (d->ns == 0 && d->nv == 0) {
        mvaddstr(y0 + h / 2, lw + w / 2 - 9, "(waiting for data)");
        return;
    }
    double x0 = INFINITY, x1 = -INFINITY, lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < d->ns; i++) x0 = fmin(x0, d->sx[i]), x1 = fmax(x1, d->sx[i]);
    for (int64_t i = 0; i < d->nv; i++) x0 = fmin(x0, d->vx[i]), x1 = fmax(x1, d->vx[i]);
    if (goal_steps(d) < INT64_MAX) x1 = fmax(x1, (double)goal_steps(d));
    if (x1 <= x0) x1 = x0 + 1;
    /* Bucket averages of the train loss per column. */
    double *col = calloc((size_t)w, sizeof *col);
    int *cnt = calloc((size_t)w, sizeof *cnt);
    if (!col || !cnt) {
        free(col), free(cnt);
        return;
    }
    for (int64_t i = 0; i < d->ns; i++) {
        int c = (int)((d->sx[i] - x0) / (x1 - x0) * (w - 1));
        if (c >= 0 && c < w && isfinite(d->sy[i])) col[c] += d->sy[i], cnt[c]++;
    }
    for (int c = 0; c < w; c++)
        if (cnt[c]) col[c] /= cnt[c], lo = fmin(lo, col[c]), hi = fmax(hi, col[c]);
    for (int64_t i = 0; i < d->nv; i++)
        if (isfinite(d->vy[i])) lo = fmin(lo, d->vy[i]), hi = fmax(hi, d->vy[i]);
    if (!isfinite(lo)) lo = 0, hi = 1;
    if (hi - lo < 1e-6) hi = lo + 1e-3, lo -= 1e-3;
    for (int r = 0; r < h; r++) {
        double v = hi - (hi - lo) * r / (h - 1);
        if (r % 3 == 0 || r == h - 1) mvprintw(y0 + r, 0, "%8.3f", v);
        mvaddch(y0 + r, lw - 1, ACS_VLINE);
    }
    for (int c = 0; c < w; c++) {
        if (!cnt[c]) continue;
        int r = (int)lround((hi - col[c]) / (hi - lo) * (h - 1));
        mvaddch(y0 + r, lw + c, '*' | COLOR_PAIR(1));
    }
    for (int64_t i = 0; i < d->nv; i++) {
        int c = (int)((d->vx[i] - x0) / (x1 - x0) * (w - 1));
        int r = (int)lround((hi - d->vy[i]) / (hi - lo) * (h - 1));
        if (c >= 0 && c < w && r >= 0 && r < h)
            mvaddch(y0 + r, lw + c, 'o' | A_BOLD | COLOR_PAIR(2));
    }
    free(col), free(cnt);
}

static void draw(em_dashboard *d)
{
    if (!d->scr) return;
    erase();
    const em_train_info *i = &d->info;
    const em_train_metrics *m = &d->last;
    char ranks[64];
    fmt_ranks(i, ranks, sizeof ranks);
    attron(A_BOLD);
    mvprintw(0, 0, " ember train  %.1fM params  %lldL x %lld  %lld heads  ctx %lld  on %s (%s)%s%s",
             i->num_params / 1e6, (long long)i->model.n_layer, (long long)i->model.n_embd,
             (long long)i->model.n_head, (long long)i->model.block_size, i->device, d->device,
             i->bf16 ? "  bf16" : "", ranks);
    attroff(A_BOLD);
    /* progress */
    int64_t goal = goal_steps(d);
    double frac = goal > 0 && goal < INT64_MAX ? fmin(1.0, (double)m->step / (double)goal) : 0;
    char goal_text[24];
    fmt_goal(goal, goal_text, sizeof goal_text);
    int bw = COLS - 40 > 10 ? COLS - 40 : 10;
    char eta[32], el[32];
    fmt_time(m->eta_s, eta, sizeof eta);
    fmt_time(m->elapsed_s, el, sizeof el);
    mvprintw(2, 1, "step %lld/%s ", (long long)m->step, goal_text);
    int x = getcurx(stdscr);
    addch('[');
    for (int k = 0; k < bw && x + bw < COLS; k++) addch(k < (int)(frac * bw) ? '#' : '.');
    printw("] %3.0f%%  %s  eta %s", frac * 100, el, eta);
    char mem[32], tot[32];
    fmt_bytes((double)m->mem_in_use, mem, sizeof mem);
    if (m->mem_total)
        fmt_bytes((double)m->mem_total, tot, sizeof tot);
    else
        snprintf(tot, sizeof tot, "?");
    char val[32];
    if (isfinite(d->last_val))
        snprintf(val, sizeof val, "%.4f", d->last_val);
    else
        snprintf(val, sizeof val, "--");
    mvprintw(3, 1,
             "loss %.4f   val %s   lr %.2e   norm %.3f   %.0f tok/s   %.1f ms/step   mem %s / %s",
             m->loss, val, m->lr, m->grad_norm, m->tokens_per_s, m->step_ms, mem, tot);
    /* chart, sample, messages */
    int sample_rows = LINES >= 30 ? 6 : 3;
    int chart_h = LINES - 5 - sample_rows - 3;
    mvprintw(4, 1, "loss: * train  ");
    attron(COLOR_PAIR(2));
    printw("o validation");
    attroff(COLOR_PAIR(2));
    draw_chart(d, 5, chart_h);
    int y = 5 + (chart_h > 0 ? chart_h : 0);
    mvhline(y, 0, ACS_HLINE, COLS);
    if (d->sample[0]) mvprintw(y, 2, " sample at step %lld ", (long long)d->sample_step);
    int r = 0, c = 0;
    move(y + 1, 0);
    for (const char *p = d->sample; *p && r < sample_rows; p++) {
        if (*p == '\n' || c >= COLS - 1) {
            r++, c = 0;
            if (r < sample_rows) move(y + 1 + r, 0);
            if (*p == '\n') continue;
        }
        addch((unsigned char)*p);
        c++;
    }
    for (int k = 0; k < 2; k++) mvprintw(LINES - 3 + k, 1, "%.*s", COLS - 2, d->msg[2 + k]);
    attron(A_DIM);
    mvprintw(LINES - 1, 1, "q: stop and save");
    attroff(A_DIM);
    refresh();
}

/* ---- observer callbacks ---------------------------------------------------------------------- */

static void on_begin(void *user, const em_train_info *info)
{
    em_dashboard *d = user;
    d->info = *info;
    snprintf(d->device, sizeof d->device, "%s", info->device_desc ? info->device_desc : "");
    d->info.device = strdup(info->device ? info->device : "");
    d->info.out_dir = strdup(info->out_dir ? info->out_dir : "");
    d->info.device_desc = NULL;
    if (d->mode == EM_DASH_TUI) {
        d->scr = newterm(NULL, stdout, stdin);
        if (!d->scr) {
            d->mode = EM_DASH_PLAIN;
        } else {
            cbreak();
            noecho();
            curs_set(0);
            nodelay(stdscr, TRUE);
            keypad(stdscr, TRUE);
            if (has_colors()) {
                start_color();
                use_default_colors();
                init_pair(1, COLOR_CYAN, -1);
                init_pair(2, COLOR_YELLOW, -1);
            }
            draw(d);
        }
    }
    if (d->mode == EM_DASH_PLAIN) plain_begin(d);
}

static void on_step(void *user, const em_train_metrics *m)
{
    em_dashboard *d = user;
    d->last = *m;
    push(&d->sx, &d->sy, &d->ns, &d->caps, (double)m->step, m->loss);
    if (d->mode == EM_DASH_TUI)
        draw(d);
    else if (d->mode == EM_DASH_PLAIN)
        plain_step(d, m);
}

static void on_eval(void *user, int64_t step, double v)
{
    em_dashboard *d = user;
    d->last_val = v;
    push(&d->vx, &d->vy, &d->nv, &d->capv, (double)step, v);
    if (d->mode == EM_DASH_TUI)
        draw(d);
    else if (d->mode == EM_DASH_PLAIN) {
        fprintf(d->out, "step %6lld | validation loss %.4f\n", (long long)step, v);
        fflush(d->out);
    }
}

static void on_sample(void *user, int64_t step, const char *text)
{
    em_dashboard *d = user;
    snprintf(d->sample, sizeof d->sample, "%s", text);
    d->sample_step = step;
    if (d->mode == EM_DASH_TUI)
        draw(d);
    else if (d->mode == EM_DASH_PLAIN) {
        fprintf(d->out, "---- sample at step %lld ----\n%s\n----\n", (long long)step, text);
        fflush(d->out);
    }
}

static void on_message(void *user, const char *text)
{
    em_dashboard *d = user;
    memmove(d->msg[0], d->msg[1], sizeof d->msg - sizeof d->msg[0]);
    snprintf(d->msg[3], sizeof d->msg[3], "%s", text);
    if (d->mode == EM_DASH_TUI)
        draw(d);
    else if (d->mode == EM_DASH_PLAIN) {
        fprintf(d->out, "ember train: %s\n", text);
        fflush(d->out);
    }
}

static void leave_screen(em_dashboard *d)
{
    if (!d->scr) return;
    endwin();
    delscreen(d->scr);
    d->scr = NULL;
}

static void on_end(void *user, const em_train_metrics *m)
{
    em_dashboard *d = user;
    if (d->mode == EM_DASH_TUI) {
        leave_screen(d);
        d->mode = EM_DASH_PLAIN;
        /* What the screen showed, as lines that stay in the terminal. */
        for (int k = 0; k < 4; k++)
            if (d->msg[k][0]) fprintf(d->out, "ember train: %s\n", d->msg[k]);
        if (d->sample[0])
            fprintf(d->out, "---- sample at step %lld ----\n%s\n----\n", (long long)d->sample_step,
                    d->sample);
    }
    if (d->mode == EM_DASH_PLAIN) {
        char el[32];
        fmt_time(m->elapsed_s, el, sizeof el);
        fprintf(d->out, "ember train: done at step %lld, loss %.4f", (long long)m->step, m->loss);
        if (isfinite(d->last_val)) fprintf(d->out, ", validation loss %.4f", d->last_val);
        fprintf(d->out, ", %s\n", el);
        fflush(d->out);
    }
}

static bool on_should_stop(void *user)
{
    em_dashboard *d = user;
    if (d->mode == EM_DASH_TUI && d->scr) {
        int ch;
        while ((ch = getch()) != ERR) {
            if (ch == 'q' || ch == 'Q') d->stop = true;
            if (ch == KEY_RESIZE) draw(d);
        }
    }
    return d->stop;
}

em_dashboard *em_dashboard_new(em_dashboard_mode mode, FILE *out)
{
    em_dashboard *d = calloc(1, sizeof *d);
    if (!d) {
        em_set_error(EM_ERR_NOMEM, "em_dashboard_new: out of memory");
        return NULL;
    }
    if (mode == EM_DASH_AUTO)
        mode = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO) ? EM_DASH_TUI : EM_DASH_PLAIN;
    d->mode = mode;
    d->out = out ? out : stdout;
    d->last_val = NAN;
    d->last.eta_s = d->last.elapsed_s = NAN;
    return d;
}

em_train_observer em_dashboard_observer(em_dashboard *d)
{
    em_train_observer o = {on_begin,   on_step, on_eval,        on_sample,
                           on_message, on_end,  on_should_stop, d};
    return o;
}

void em_dashboard_free(em_dashboard *d)
{
    if (!d) return;
    leave_screen(d);
    free((char *)d->info.device);
    free((char *)d->info.out_dir);
    free(d->sx), free(d->sy), free(d->vx), free(d->vy);
    free(d);
}
