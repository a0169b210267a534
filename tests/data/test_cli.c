/* test_cli.c — `ember tokenize` and `ember data` as a user runs them: ids printed for a file and
 * decoded back; `data prepare` on a folder of documents writes shards that an independent reader
 * (here) finds equal to the library's encoding with <|endoftext|> between documents; uint32
 * shards (version 2) for a vocabulary over 65,536 ids; `data train-tokenizer`; and clear errors
 * with a non-zero exit for missing inputs, bad options and corrupt shards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "data_util.h"

/* Runs `ember ARGS` with output captured (stderr too); returns the exit status. */
static int ember(const char *args, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", EMBER_CLI_PATH, args);
    int st;
    char *o = run_capture(cmd, &st);
    if (out)
        *out = o;
    else
        free(o);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

/* The independent reader: header fields and ids of an llm.c shard. */
static uint32_t *read_shard(const char *path, int *version, size_t *n)
{
    FILE *f = fopen(path, "rb");
    int32_t h[256];
    if (!f || fread(h, 4, 256, f) != 256 || h[0] != 20240520) {
        if (f) fclose(f);
        return NULL;
    }
    *version = h[1];
    *n = (size_t)h[2];
    uint32_t *ids = calloc(*n + 1, sizeof *ids);
    for (size_t i = 0; i < *n; i++) {
        uint16_t v16;
        if (h[1] == 1 && fread(&v16, 2, 1, f) == 1)
            ids[i] = v16;
        else if (h[1] == 2 && fread(&ids[i], 4, 1, f) == 1)
            continue;
        else if (h[1] != 1)
            break;
    }
    fclose(f);
    return ids;
}

static void test_tokenize_roundtrip(void **state)
{
    (void)state;
    char dir[512], path[1024], args[4096];
    scratch_dir("cli-tok", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/in.txt", dir);
    const char *text = "Hello world! It's 2024.\n\xe6\x97\xa5\xe6\x9c\xac <|endoftext|> done\n";
    write_file(path, text, strlen(text));
    em_tokenizer *t = em_tok_gpt2(NULL);
    if (!t) {
        fprintf(stderr, "SKIP: %s\n", em_last_error());
        remove_dir(dir);
        skip();
    }
    char *out;
    snprintf(args, sizeof args, "tokenize --tokenizer gpt2 '%s'", path);
    assert_int_equal(ember(args, &out), 0);
    em_tokens tk = {0};
    assert_int_equal(em_tok_encode(t, text, strlen(text), true, &tk), EM_OK);
    uint32_t ids[256];
    size_t n = 0;
    for (const char *p = out; *p;) n += parse_ids(&p, ids + n, 256 - n);
    assert_int_equal(n, tk.len);
    assert_memory_equal(ids, tk.ids, n * sizeof *ids);
    /* decode them back */
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    write_file(path, out, strlen(out));
    free(out);
    snprintf(args, sizeof args, "tokenize --decode '%s'", path);
    assert_int_equal(ember(args, &out), 0);
    assert_string_equal(out, text);
    free(out);
    /* char tokenizer, saved and used for decoding */
    snprintf(path, sizeof path, "%s/in.txt", dir);
    snprintf(
        args, sizeof args,
        "tokenize --tokenizer char --save-tokenizer '%s/char.json' '%s' > "
        "'%s/char_ids.txt' && '%s' tokenize --tokenizer '%s/char.json' --decode '%s/char_ids.txt'",
        dir, path, dir, EMBER_CLI_PATH, dir, dir);
    assert_int_equal(ember(args, &out), 0);
    assert_string_equal(out, text);
    free(out);
    /* chat-template tokens */
    snprintf(path, sizeof path, "%s/chat.txt", dir);
    write_file(path, "<|im_start|>user\nhi<|im_end|>", 29);
    snprintf(args, sizeof args, "tokenize --chat '%s'", path);
    assert_int_equal(ember(args, &out), 0);
    assert_string_equal(out, "50257 7220 198 5303 50258\n");
    free(out);
    /* misuse */
    assert_int_equal(ember("tokenize /no/such/file.txt", &out), 1);
    assert_non_null(strstr(out, "/no/such/file.txt"));
    free(out);
    assert_int_equal(ember("tokenize --bogus", &out), 2);
    assert_non_null(strstr(out, "--bogus"));
    free(out);
    assert_int_equal(ember("tokenize --tokenizer /no/such/tok.json /dev/null", &out), 1);
    assert_non_null(strstr(out, "no such file"));
    free(out);
    snprintf(path, sizeof path, "%s/bad_ids.txt", dir);
    write_file(path, "1 2 99999999 3", 14);
    snprintf(args, sizeof args, "tokenize --decode '%s'", path);
    assert_int_equal(ember(args, &out), 1);
    assert_non_null(strstr(out, "99999999"));
    free(out);
    em_tokens_free(&tk);
    em_tok_free(t);
    remove_dir(dir);
}

static void test_prepare_folder(void **state)
{
    (void)state;
    em_tokenizer *t = em_tok_gpt2(NULL);
    if (!t) {
        fprintf(stderr, "SKIP: %s\n", em_last_error());
        skip();
    }
    char dir[512], path[1024], args[4096];
    scratch_dir("cli-prep", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/in", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/in/sub", dir);
    mkdir(path, 0755);
    /* three documents (one in a sub-folder), sorted by path; a hidden file is skipped */
    const char *docs[3] = {
        "First document. It is short.\n",
        "Second one, with more words in it: the quick brown fox jumps over the lazy dog.\n",
        "Third, in a folder: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac 12345\n",
    };
    const char *names[3] = {"a.txt", "b.txt", "sub/c.txt"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/in/%s", dir, names[i]);
        write_file(path, docs[i], strlen(docs[i]));
    }
    snprintf(path, sizeof path, "%s/in/.hidden", dir);
    write_file(path, "SECRET", 6);
    char *out;
    snprintf(args, sizeof args,
             "data prepare --input '%s/in' --out '%s/out' --val-fraction 0.25 "
             "--shard-tokens 20",
             dir, dir);
    assert_int_equal(ember(args, &out), 0);
    assert_non_null(strstr(out, "3 file(s)"));
    free(out);
    /* expected: <|endoftext|> doc for each document */
    em_tokens want = {0}; /* em_tok_encode appends */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(em_tok_encode(t, "<|endoftext|>", 13, true, &want), EM_OK);
        assert_int_equal(want.ids[want.len - 1], 50256);
        assert_int_equal(em_tok_encode(t, docs[i], strlen(docs[i]), false, &want), EM_OK);
    }
    size_t nval = (size_t)(0.25 * (double)want.len + 0.5);
    /* read every shard back in order: val first, then train_000000, train_000001, ... */
    size_t got = 0;
    int version;
    size_t n;
    snprintf(path, sizeof path, "%s/out/val_000000.bin", dir);
    uint32_t *ids = read_shard(path, &version, &n);
    assert_non_null(ids);
    assert_int_equal(version, 1);
    assert_int_equal(n, nval);
    assert_memory_equal(ids, want.ids, n * sizeof *ids);
    got += n;
    free(ids);
    for (int k = 0; got < want.len; k++) {
        snprintf(path, sizeof path, "%s/out/train_%06d.bin", dir, k);
        ids = read_shard(path, &version, &n);
        assert_non_null(ids);
        assert_true(n <= 20);
        assert_memory_equal(ids, want.ids + got, n * sizeof *ids);
        got += n;
        free(ids);
    }
    assert_int_equal(got, want.len);
    snprintf(path, sizeof path, "%s/out/tokenizer.json", dir);
    em_tokenizer *saved = em_tok_load(path);
    assert_non_null(saved);
    assert_int_equal(em_tok_vocab_size(saved), 50257);
    em_tok_free(saved);
    /* `data info` checks shards; a corrupt one is named */
    snprintf(path, sizeof path, "%s/out/train_000000.bin", dir);
    FILE *f = fopen(path, "r+b");
    fputc(0x11, f);
    fclose(f);
    snprintf(args, sizeof args, "data info '%s'", path);
    assert_int_equal(ember(args, &out), 1);
    assert_non_null(strstr(out, "magic"));
    free(out);
    /* misuse */
    assert_int_equal(ember("data prepare --input /no/such/dir --out /tmp/x", &out), 1);
    assert_non_null(strstr(out, "/no/such/dir"));
    free(out);
    assert_int_equal(ember("data prepare --out /tmp/x", &out), 2);
    assert_non_null(strstr(out, "required"));
    free(out);
    assert_int_equal(ember("data prepare --input x --out y --val-fraction 2", &out), 2);
    free(out);
    em_tokens_free(&want);
    em_tok_free(t);
    remove_dir(dir);
}

static void test_prepare_wide_and_train(void **state)
{
    (void)state;
    char dir[512], path[1024], args[4096];
    scratch_dir("cli-wide", dir, sizeof dir);
    /* a tiktoken vocabulary of every byte and every byte pair: 65,792 ids, over 65,536 */
    snprintf(path, sizeof path, "%s/wide.tiktoken", dir);
    FILE *f = fopen(path, "w");
    static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 256; i++) fprintf(f, "%c%c== %d\n", B64[i >> 2], B64[(i & 3) << 4], i);
    for (int i = 0; i < 65536; i++) {
        int a = i >> 8, b = i & 255;
        fprintf(f, "%c%c%c= %d\n", B64[a >> 2], B64[((a & 3) << 4) | (b >> 4)], B64[(b & 15) << 2],
                256 + i);
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/text.txt", dir);
    const char *text = "zz top \xff\xfe wide vocabularies need uint32 shards";
    write_file(path, text, strlen(text));
    char *out;
    snprintf(args, sizeof args,
             "data prepare --tokenizer '%s/wide.tiktoken' --input '%s' --out "
             "'%s/out' --val-fraction 0 --no-eot",
             dir, path, dir);
    assert_int_equal(ember(args, &out), 0);
    free(out);
    snprintf(path, sizeof path, "%s/out/train_000000.bin", dir);
    int version;
    size_t n;
    uint32_t *ids = read_shard(path, &version, &n);
    assert_non_null(ids);
    assert_int_equal(version, 2);
    bool wide = false;
    for (size_t i = 0; i < n; i++) wide |= ids[i] > 65535;
    assert_true(wide);
    free(ids);
    /* train-tokenizer */
    snprintf(path, sizeof path, "%s/corpus.txt", dir);
    f = fopen(path, "w");
    for (int i = 0; i < 300; i++) fprintf(f, "the lowest newer widest %d lower newest\n", i);
    fclose(f);
    snprintf(args, sizeof args,
             "data train-tokenizer --input '%s' --vocab-size 300 --out '%s/bpe.json'", path, dir);
    assert_int_equal(ember(args, &out), 0);
    assert_non_null(strstr(out, "trained 300 ids"));
    free(out);
    snprintf(args, sizeof args, "data train-tokenizer --input '%s' --vocab-size 12 --out x", path);
    assert_int_equal(ember(args, &out), 2);
    free(out);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_roundtrip),
        cmocka_unit_test(test_prepare_folder),
        cmocka_unit_test(test_prepare_wide_and_train),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
