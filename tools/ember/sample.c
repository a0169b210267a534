/* sample.c — `ember sample`: text generation from a checkpoint. The prompt is encoded, fed once,
 * then tokens are sampled one at a time through the KV cache (temperature, top-k, top-p,
 * repetition penalty, a seed) and streamed to stdout as they come; --stop strings end the text
 * (they are not printed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gen_common.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ember sample --checkpoint PATH [--prompt TEXT] [--max-tokens N]\n"
        "                    [--temperature T] [--top-k K] [--top-p P]\n"
        "                    [--repetition-penalty R] [--seed S] [--stop TEXT]...\n"
        "                    [--num-samples N] [--tokenizer T] [--device D] [--no-echo]\n\n"
        "Generates text from a checkpoint (ckpt.safetensors of `ember train`, a folder holding\n"
        "one, or a Hugging Face GPT-2 model.safetensors) and streams it to stdout.\n"
        "  --prompt TEXT            text to continue (default: <|endoftext|>, i.e. from scratch)\n"
        "  --max-tokens N           tokens to generate (default 200)\n"
        "  --temperature T          0 is greedy (default 0.8)\n"
        "  --top-k K                sample among the K most likely (default 0: off)\n"
        "  --top-p P                nucleus: the smallest set holding P of the mass (default 1)\n"
        "  --repetition-penalty R   > 1 discourages tokens already present (default 1: off)\n"
        "  --seed S                 the same seed gives the same text (default 1337)\n"
        "  --stop TEXT              stop before TEXT (repeatable)\n"
        "  --num-samples N          independent samples, seeds S, S+1, ... (default 1)\n"
        "  --tokenizer T            default: tokenizer.json beside the checkpoint, else gpt2\n"
        "  --device D               cpu, cuda:0, vulkan:0, opencl:0 (default: the best present)\n"
        "  --no-echo                do not print the prompt before the continuation\n");
}

int em_cli_sample(int argc, char **argv)
{
    const char *ckpt = NULL, *prompt = NULL, *tokenizer = NULL, *device = NULL, *export_dir = NULL;
    int64_t max_tokens = 200, top_k = 0, num_samples = 1;
    double temperature = 0.8, top_p = 1.0, rep = 1.0;
    uint64_t seed = 1337;
    bool no_echo = false;
    gc_strs stops = {0};
    const gc_opt opts[] = {
        {"--checkpoint", GC_STR, &ckpt},
        {"--prompt", GC_STR, &prompt},
        {"--max-tokens", GC_I64, &max_tokens},
        {"--temperature", GC_DBL, &temperature},
        {"--top-k", GC_I64, &top_k},
        {"--top-p", GC_DBL, &top_p},
        {"--repetition-penalty", GC_DBL, &rep},
        {"--seed", GC_U64, &seed},
        {"--stop", GC_STRS, &stops},
        {"--tokenizer", GC_STR, &tokenizer},
        {"--device", GC_STR, &device},
        {"--num-samples", GC_I64, &num_samples},
        {"--no-echo", GC_FLAG, &no_echo},
        {"--export-hf", GC_STR, &export_dir},
    };
    int r = gc_parse("ember sample", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == 1) {
        usage(stdout);
        return 0;
    }
    const char *bad = NULL;
    if (r == 0 && !ckpt)
        bad = "--checkpoint is required";
    else if (r == 0 && max_tokens < 0)
        bad = "--max-tokens must not be negative";
    else if (r == 0 && temperature < 0)
        bad = "--temperature must not be negative";
    else if (r == 0 && top_k < 0)
        bad = "--top-k must not be negative";
    else if (r == 0 && !(top_p > 0 && top_p <= 1))
        bad = "--top-p must be in (0, 1]";
    else if (r == 0 && !(rep > 0))
        bad = "--repetition-penalty must be positive";
    else if (r == 0 && num_samples < 1)
        bad = "--num-samples must be at least 1";
    if (bad) fprintf(stderr, "ember sample: %s\n", bad);
    if (r != 0 || bad) {
        fprintf(stderr, "\n");
        usage(stderr);
        return 2;
    }
    em_device *dev;
    em_gpt *g;
    em_tokenizer *tok;
    if (export_dir) {
        dev = em_device_open(device && strcmp(device, "auto") != 0 ? device : "cpu");
        char path[4096], dir[4096];
        gc_checkpoint_path(ckpt, path, sizeof path, dir, sizeof dir);
        g = dev ? em_gpt_load(path, dev, EM_F32) : NULL;
        em_status st = g ? em_gpt_export_hf(g, export_dir) : em_last_status();
        if (st != EM_OK)
            fprintf(stderr, "ember sample: %s\n", em_last_error());
        else
            printf("wrote %s/model.safetensors and %s/config.json\n", export_dir, export_dir);
        em_gpt_free(g);
        if (dev) em_device_close(dev);
        return st == EM_OK ? 0 : 1;
    }
    if (!gc_open("ember sample", ckpt, tokenizer, device, &dev, &g, &tok)) return 1;
    em_tokens ids = {0};
    int rc = 0;
    if (prompt && *prompt) {
        if (em_tok_encode(tok, prompt, strlen(prompt), true, &ids) != EM_OK) {
            fprintf(stderr, "ember sample: the prompt: %s\n", em_last_error());
            rc = 1;
        }
    } else {
        int64_t eot = em_tok_eot(tok);
        if (eot >= 0) {
            ids.ids = malloc(sizeof *ids.ids);
            if (ids.ids) ids.ids[0] = (uint32_t)eot, ids.len = ids.cap = 1;
        } else {
            em_tok_encode(tok, "\n", 1, false, &ids);
        }
    }
    int64_t *p = rc == 0 ? malloc((ids.len + 1) * sizeof *p) : NULL;
    for (size_t i = 0; p && i < ids.len; i++) p[i] = ids.ids[i];
    for (int64_t s = 0; rc == 0 && p && s < num_samples; s++) {
        if (s > 0) printf("\n---------------\n");
        if (!no_echo && prompt) fputs(prompt, stdout);
        fflush(stdout);
        gc_stream st;
        gc_stream_init(&st, tok, stdout, stops.v, stops.n);
        em_sample_config sc = {temperature, top_k, top_p, rep, seed + (uint64_t)s};
        int64_t n = 0;
        if (em_gpt_generate(g, p, (int64_t)ids.len, max_tokens, &sc, em_tok_eot(tok),
                            gc_stream_token, &st, &n) != EM_OK) {
            fprintf(stderr, "\nember sample: %s\n", em_last_error());
            rc = 1;
        }
        gc_stream_finish(&st);
        printf("\n");
    }
    free(p);
    em_tokens_free(&ids);
    em_tok_free(tok);
    em_gpt_free(g);
    em_device_close(dev);
    return rc;
}
