/* ember/ember.h — the whole public API in one include. */
#ifndef EMBER_EMBER_H
#define EMBER_EMBER_H
#include "ember/base.h"
#include "ember/kernel.h"
#include "ember/runtime.h"
#include "ember/tensor.h"
#include "ember/tensor_op.h"
#include "ember/tensor_grad.h"
#include "ember/autodiff.h"
#include "ember/nn.h"
#include "ember/optim.h"
#include "ember/record.h"
#include "ember/data.h"
#include "ember/gpt.h"
#include "ember/dist.h"
#include "ember/train.h"
#endif
