/* Everything fabric-msg binds from libfabric. bindgen reads this file; the
 * C shims it generates for libfabric's static inline functions include it too. */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_errno.h>
#if defined(FABRIC_MSG_HAVE_FI_EXT_H)
#include <rdma/fi_ext.h>
#endif
