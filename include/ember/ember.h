/* ember/ember.h — the whole public API in one include. */
#ifndef EMBER_EMBER_H
#define EMBER_EMBER_H
#include "ember/base.h"
#include "ember/kernel.h"
#include "ember/runtime.h"
#endif
